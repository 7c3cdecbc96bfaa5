/* run_events.c - what a syscall handler (or a long engine operation) asks of the run under way: to
 * stop the run with an event for the caller (and serve the syscall again on resume, or not), to
 * sleep until a time unless a kick, the run's deadline or the guest's alarm comes first, whether a
 * long operation must give up, to re-arm the run's wake-up timer after the guest changed its alarm,
 * and the guest's CPU clock including the run under way.
 *
 * The syscall families (sys_*.c) and the file layer call these; they never call into run_loop.c,
 * which calls them too.
 */
#include "util.h"
#include "vm.h"
#include "process.h"
#include "sandbox_state.h"

#include <poll.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* The run under way on this thread (zb_sandbox_run sets both). */
#define OUTPUT_EVENT_MAX (1ul << 20) /* bytes of console output in one OUTPUT event */

__thread int64_t zb_run_deadline_ns;
__thread sigset_t zb_run_wait_sigmask;

zb_event *zb_stop_event(zb_sandbox *sb, int kind, int retry) {
    if (!sb->has_stop || sb->stop_ev.kind != kind) memset(&sb->stop_ev, 0, sizeof sb->stop_ev);
    sb->stop_ev.kind = kind;
    sb->has_stop = 1;
    sb->stop_retry = retry;
    return &sb->stop_ev;
}

/* Output the guest wrote to its console (stdout/stderr): appended to the stop event under way if
 * it is output of the same stream, else it becomes the run's stop event; at most OUTPUT_EVENT_MAX
 * bytes per event (the rest is written again after the host drained this). */
int zb_output(zb_sandbox *sb, int stream, const void *data, size_t len) {
    zb_event *ev = &sb->stop_ev;
    if (sb->has_stop && (ev->kind != ZB_EVENT_OUTPUT || ev->stream != stream)) return 0;
    size_t have = sb->has_stop ? ev->len : 0;
    len = ZB_MIN(len, OUTPUT_EVENT_MAX - have);
    if (have + len > sb->out_cap) {
        size_t cap = ZB_MAX(have + len, sb->out_cap ? sb->out_cap * 2 : 4096);
        uint8_t *nb = realloc(sb->out_buf, cap);
        if (!nb) return -ENOMEM;
        sb->out_buf = nb;
        sb->out_cap = cap;
    }
    memcpy(sb->out_buf + have, data, len);
    ev = zb_stop_event(sb, ZB_EVENT_OUTPUT, 0);
    ev->stream = stream;
    ev->data = sb->out_buf;
    ev->len = have + len;
    return (int)len;
}

int zb_take_kick(zb_sandbox *sb) {
    int outside = zb_outside_kick;
    zb_outside_kick = 0;
    int fam = sb->fam && atomic_exchange(&sb->fam->kick, 0);
    return atomic_exchange(&sb->kick_requested, 0) || fam || outside;
}

int zb_kick_pending(const zb_sandbox *sb) {
    return atomic_load(&sb->kick_requested) || (sb->fam && atomic_load(&sb->fam->kick));
}

/* With other guest threads, a sleep of the running thread yields to them instead when one can run
 * now, or as soon as a waiting one's timeout passes: the thread then waits in state RETRY and its
 * syscall is served again when it is switched back in (with the same wake time). Another thread
 * that waits in a yielded syscall (RETRY) does not stop this sleep: nothing it waits for can
 * change while no thread runs, except by time. */
static int yield_sleep(zb_sandbox *sb, int64_t wake_ns, int64_t now) {
    zb_threads *ts = &sb->threads;
    if (ts->count <= 1 && !sb->fam) return 0;
    /* the same for the other processes of the family (process.h): they run in turn on the VM (and
     * one whose alarm went off meanwhile can run: its SIGALRM interrupts its wait) */
    if (sb->fam) zb_family_alarms_check(sb->fam, sb, now);
    int procs = sb->fam && (zb_family_others_runnable(sb, now) || zb_family_next_wake(sb) <= now);
    if (!procs && !zb_threads_others_runnable(ts, 0) && zb_threads_next_wake(ts) > now) return 0;
    zb_thread *me = &ts->t[ts->current];
    me->state = ZB_THREAD_RETRY;
    me->wake_ns = wake_ns;
    me->wait_gen = zb_wake_gen;
    sb->cpu.pending_wake_ns = wake_ns;
    return 1;
}

int zb_sleep_yields(zb_sandbox *sb, int64_t wake_ns, int64_t now) { return yield_sleep(sb, wake_ns, now); }

int64_t zb_sleep_bound(const zb_sandbox *sb, int64_t until) {
    if (sb->threads.count > 1) until = ZB_MIN(until, zb_threads_next_wake(&sb->threads));
    if (sb->fam) until = ZB_MIN(until, zb_family_next_wake(sb));
    return until;
}

long zb_sleep_until(zb_sandbox *sb, int64_t wake_ns) {
    for (;;) {
        int64_t now = zb_now_ns();
        if (now >= wake_ns) return 0;
        if (yield_sleep(sb, wake_ns, now)) return ZB_SYSCALL_BLOCK;
        int kind = 0;
        if (zb_take_kick(sb)) kind = ZB_EVENT_KICK;
        else if (zb_run_deadline_ns && now >= zb_run_deadline_ns) kind = ZB_EVENT_TIMEOUT;
        if (kind) {
            sb->cpu.pending_wake_ns = wake_ns;
            zb_stop_event(sb, kind, 1);
            return ZB_SYSCALL_STOP;
        }
        if (zb_alarm_check(sb, now) && zb_signal_interrupts(sb, SIGALRM)) return -EINTR;
        int64_t until = zb_run_deadline_ns ? ZB_MIN(wake_ns, zb_run_deadline_ns) : wake_ns;
        if (sb->sig.alarm_ns) until = ZB_MIN(until, sb->sig.alarm_ns);
        if (sb->threads.count > 1) until = ZB_MIN(until, zb_threads_next_wake(&sb->threads));
        if (sb->fam) until = ZB_MIN(until, zb_family_next_wake(sb));
        int64_t ns = ZB_MIN(until - now, (int64_t)3600 * 1000000000);
        struct timespec ts = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
        zb_wait_ppoll(NULL, 0, &ts, &zb_run_wait_sigmask); /* returns early on the kick signal */
    }
}

/* The agent's main thread reads the UART for its next request. Under ipykernel the notebook's
 * other threads keep running meanwhile, and so does the kernel's asyncio loop (tasks and timers a
 * cell left): so between requests the host sets input_yields and the reader waits like a sleep:
 * until its own timeout when it has one (the agent's loop polls the UART with the time of its
 * next timer), else without end while another thread can run or wake by itself (it yields to a
 * runnable thread, sleeps until a waiter's timeout or the guest's alarm and yields then). The run
 * stops at a kick (the host's next request: EngineServer makes its socket send the kick signal).
 * Once nothing can run or wake by itself (no timeout, the other threads all wait on futexes with
 * no timeout), nothing can change before a request comes, and the run stops for INPUT as it does
 * without threads: an idle sandbox costs no CPU. The INPUT event says whether the wait was timed,
 * so that the host knows the guest has work between requests. A stop keeps the deadline for the
 * wait served again on resume. */
long zb_wait_input(zb_sandbox *sb, int64_t wake_ns) {
    const zb_threads *ts = &sb->threads;
    int timed = wake_ns != INT64_MAX;
    sb->cpu.waits_input = 1;
    if (sb->input_yields && (timed || (ts->count > 1 && (zb_threads_others_runnable(ts, 1) ||
                                                         zb_threads_next_wake(ts) != INT64_MAX || sb->sig.alarm_ns))))
        return zb_sleep_until(sb, wake_ns);
    if (timed) sb->cpu.pending_wake_ns = wake_ns;
    zb_stop_event(sb, ZB_EVENT_INPUT, 1)->timed = timed;
    return ZB_SYSCALL_STOP;
}

int zb_should_stop(const zb_sandbox *sb) {
    if (!atomic_load(&sb->running)) return 0; /* the host's own calls (export, diff) have no deadline */
    return zb_kick_pending(sb) || (zb_run_deadline_ns && zb_now_ns() >= zb_run_deadline_ns);
}

long zb_stop_for_deadline(zb_sandbox *sb) {
    zb_stop_event(sb, zb_take_kick(sb) ? ZB_EVENT_KICK : ZB_EVENT_TIMEOUT, 1);
    return ZB_SYSCALL_STOP;
}

/* ---- the run's wake-up timer ---- */

/* A kick signal that arrived while this thread blocked it (between two KVM_RUNs) is still
 * queued: take it and classify it as its handler does. Done before the wake-up timer is set
 * again, since Linux drops a POSIX timer's queued signal once the timer is re-armed, yet that
 * signal still makes the next KVM_RUN return EINTR with no handler run: an EINTR nobody could
 * tell from the caller's own signal. */
void zb_take_blocked_kick(void) {
    sigset_t kick;
    sigemptyset(&kick);
    sigaddset(&kick, ZB_KICK_SIGNAL);
    siginfo_t si;
    struct timespec zero = {0, 0};
    int saved = errno;
    if (sigtimedwait(&kick, &si, &zero) > 0) {
        zb_kick_signal_seen = 1;
        if (si.si_code != SI_TIMER) zb_outside_kick = 1;
    }
    errno = saved;
}

/* The run's POSIX timer sends the kick signal to this thread at the earliest of the run deadline,
 * the guest's alarm and its CPU timers' expiries, so that KVM_RUN or a sleep returns in time. */
int zb_run_arm_wake_timer(zb_sandbox *sb, zb_vm *vm) {
    int64_t at = zb_run_deadline_ns;
    if (sb->sig.alarm_ns && (!at || sb->sig.alarm_ns < at)) at = sb->sig.alarm_ns;
    if (zb_cpu_timers_armed(sb)) { /* while the guest runs, its CPU clocks run with the wall clock */
        int64_t cpu_at = ZB_MAX(zb_cpu_timers_wake(sb, zb_now_ns()), 1);
        if (!at || cpu_at < at) at = cpu_at;
    }
    int64_t threads_at = zb_threads_timer_horizon(&sb->threads); /* a waiter's timeout, a time slice's end */
    sb->threads.armed_horizon = threads_at; /* (the threads' part: what ticks compare) */
    if (sb->fam) { /* another process's timeout, or the end of this one's slice when another can run */
        int64_t now = zb_now_ns(), procs_at = zb_family_next_wake(sb);
        /* a timeout already past (a sleeper that has not run since) makes that process runnable:
         * the end of the slice below is its wake-up, not a timer that fires at once and is spent */
        if (procs_at > now) threads_at = ZB_MIN(threads_at, procs_at);
        sb->threads.armed_for_procs = zb_family_others_runnable(sb, now);
        if (sb->threads.armed_for_procs) threads_at = ZB_MIN(threads_at, sb->threads.slice_start_ns + ZB_PROC_SLICE_NS);
    }
    if (threads_at != INT64_MAX && (!at || threads_at < at)) at = ZB_MAX(threads_at, 1);
    if (!at && !vm->wake_timer_live) return 0;
    if (vm->wake_timer_live) zb_take_blocked_kick();
    if (!vm->wake_timer_live) {
        struct sigevent sev;
        memset(&sev, 0, sizeof sev);
        sev.sigev_notify = SIGEV_THREAD_ID;
        sev.sigev_signo = ZB_KICK_SIGNAL;
        sev._sigev_un._tid = (pid_t)syscall(SYS_gettid);
        if (timer_create(CLOCK_MONOTONIC, &sev, &vm->wake_timer) < 0) return -1;
        vm->wake_timer_live = 1;
    }
    struct itimerspec its;
    memset(&its, 0, sizeof its); /* at == 0 disarms */
    its.it_value.tv_sec = at / 1000000000;
    its.it_value.tv_nsec = at % 1000000000;
    if (timer_settime(vm->wake_timer, TIMER_ABSTIME, &its, NULL) < 0) return -1;
    vm->wake_at = at;
    return 0;
}

/* The wake-up timer is one-shot: once its time is past it has fired, and whatever it was armed for
 * is either handled (the loop checks the deadline, the alarm and the ticks before each KVM_RUN) or
 * still to come (a mid-trap vCPU must finish its trap before it can yield). Entering KVM_RUN with a
 * spent timer would let a process that never exits (a loop in user code) run past the deadline, so
 * it is armed again first; for a time that is still past, a little later, so that the vCPU gets to
 * finish its trap rather than return EINTR at once. */
void zb_run_timer_rearm_if_spent(zb_sandbox *sb, zb_vm *vm) {
    int64_t now = zb_now_ns();
    if (!vm->wake_at || now < vm->wake_at) return;
    int rc = zb_run_arm_wake_timer(sb, vm);
    if (rc == 0 && vm->wake_at && vm->wake_at <= now) {
        struct itimerspec its;
        memset(&its, 0, sizeof its);
        its.it_value.tv_nsec = ZB_TIMER_RETRY_NS;
        rc = timer_settime(vm->wake_timer, 0, &its, NULL);
        if (rc == 0) vm->wake_at = now + ZB_TIMER_RETRY_NS;
    }
    if (rc < 0) zb_log(sb, "cannot arm the run's wake-up timer again: %s", strerror(errno));
}

void zb_run_timer_update(zb_sandbox *sb) {
    zb_vm *vm = zb_vm_of(sb);
    if (!vm || vm->attached != sb || !atomic_load(&sb->running)) return; /* armed when it next runs */
    if (zb_run_arm_wake_timer(sb, vm) < 0) zb_log(sb, "cannot arm the alarm timer: %s", strerror(errno));
}

/* ---- the guest's CPU clock ---- */

uint64_t zb_guest_uptime_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

__thread uint64_t zb_waited_ns;

int zb_wait_ppoll(struct pollfd *fds, nfds_t nfds, const struct timespec *ts, const sigset_t *mask) {
    int64_t t0 = zb_now_ns();
    int rc = ppoll(fds, nfds, ts, mask);
    int saved = errno;
    zb_waited_ns += (uint64_t)(zb_now_ns() - t0);
    errno = saved;
    return rc;
}

uint64_t zb_guest_cpu_ns(const zb_sandbox *sb) {
    uint64_t ns = sb->proc.cpu_ns; /* the finished runs, plus the one under way (on its thread) */
    if (sb->run_started_ns) ns += (uint64_t)(zb_now_ns() - sb->run_started_ns) - (zb_waited_ns - sb->run_waited_ns);
    return ns;
}

void zb_guest_cpu_split(const zb_sandbox *sb, uint64_t *user_ns, uint64_t *sys_ns) {
    uint64_t run = zb_guest_cpu_ns(sb);
    *sys_ns = ZB_MIN(sb->proc.sys_ns, run);
    *user_ns = run - *sys_ns;
}
