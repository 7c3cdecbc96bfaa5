/* snapshot.c - snapshots and forks: not implemented yet (next step of issue 3). */
#include "engine.h"

zb_snapshot *zb_sandbox_snapshot(zb_sandbox *sb, char *err) { (void)sb; zb_seterr(err, "snapshots are not implemented yet"); return NULL; }
zb_sandbox *zb_snapshot_fork(zb_snapshot *s, char *err) { (void)s; zb_seterr(err, "forks are not implemented yet"); return NULL; }
int zb_sandbox_restore(zb_sandbox *sb, zb_snapshot *s, char *err) { (void)sb; (void)s; zb_seterr(err, "restore is not implemented yet"); return -1; }
int zb_snapshot_save(zb_snapshot *s, const char *dir, char *err) { (void)s; (void)dir; zb_seterr(err, "not implemented yet"); return -1; }
zb_snapshot *zb_snapshot_load(zb_engine *e, const char *dir, char *err) { (void)e; (void)dir; zb_seterr(err, "not implemented yet"); return NULL; }
void zb_snapshot_release(zb_snapshot *s) { (void)s; }
uint64_t zb_snapshot_private_bytes(zb_snapshot *s) { (void)s; return 0; }
