/* sandbox.h - the sandbox layer (sandbox.c): creating, configuring and freeing sandboxes; the
 * public accessors are zeroboot.h's. Only the snapshot layer above calls these.
 */
#ifndef ZB_SANDBOX_H
#define ZB_SANDBOX_H
#include "util.h"

/* ---- sandboxes (sandbox.c) ----
 * A sandbox's base snapshot (sb->base) is the snapshot layer's: snapshot.c takes and drops that
 * reference (zb_sandbox_free is there), and sandbox.c never calls into snapshots. */
zb_sandbox *zb_sandbox_alloc(zb_engine *e, char *err);
/* Free everything but the base snapshot reference (the caller has dropped it). */
void zb_sandbox_destroy(zb_sandbox *sb);
/* Free the namespace and the fd table (before they are replaced by a snapshot's copies). */
void zb_sandbox_free_state(zb_sandbox *sb);
/* A fork gets files-mode policies of its own (fs.h, zb_proj_policy): changing its mode then
 * leaves the snapshot it came from, and that snapshot's other forks, as they are. */
int zb_sandbox_own_policies(zb_sandbox *sb, char *err);

#endif
