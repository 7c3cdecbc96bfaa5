/* file_kinds.h - the registry of open file kinds: one line per kind, ZB_FILE_KIND(name, number,
 * operations). Included by fs.h (the FILE_* numbers and the ops' declarations) and fdtable.c (the
 * table zb_file_new takes a kind's operations from). A new kind is a new file_*.c defining its
 * zb_file_ops, plus one line here. The numbers are saved in snapshots: never renumber a kind;
 * add new ones at the end.
 * (No include guard on purpose: every includer defines ZB_FILE_KIND its own way.) */
ZB_FILE_KIND(FILE_HOST, 1, zb_file_host_ops)       /* file_host.c: a host file (view or project) */
ZB_FILE_KIND(FILE_OVERLAY, 2, zb_file_overlay_ops) /* file_overlay.c: an in-memory overlay file */
ZB_FILE_KIND(FILE_DIR, 3, zb_file_dir_ops)         /* file_dir.c: a directory of any location */
ZB_FILE_KIND(FILE_DEV, 4, zb_file_dev_ops)         /* file_dev.c: /dev/null, zero, urandom, the UART */
ZB_FILE_KIND(FILE_CONSOLE, 5, zb_file_console_ops) /* file_console.c: stdout and stderr */
ZB_FILE_KIND(FILE_PIPE, 6, zb_file_pipe_ops)       /* file_pipe.c: one end of a pipe */
ZB_FILE_KIND(FILE_SOCKET, 7, zb_file_socket_ops)   /* file_socket.c: one end of a socketpair */
ZB_FILE_KIND(FILE_EPOLL, 8, zb_file_epoll_ops)     /* file_epoll.c: an epoll instance */
ZB_FILE_KIND(FILE_EVENTFD, 9, zb_file_eventfd_ops) /* file_eventfd.c: an eventfd counter */
ZB_FILE_KIND(FILE_INET, 10, zb_file_inet_ops)       /* file_inet.c: an internet socket (host TCP, resolver UDP) */
ZB_FILE_KIND(FILE_PTY_MASTER, 11, zb_file_pty_master_ops) /* file_pty.c: a pty's master (/dev/ptmx) */
ZB_FILE_KIND(FILE_PTY_SLAVE, 12, zb_file_pty_slave_ops)   /* file_pty.c: a pty's slave (/dev/pts/N) */
ZB_FILE_KIND(FILE_FIFO, 13, zb_file_fifo_ops)     /* file_fifo.c: an end of a named pipe (mkfifo) */
