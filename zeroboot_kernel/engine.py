"""The engine API: templates, Sandboxes that execute notebook cells (a sandbox running the guest
agent), forks. docs/ARCHITECTURE.md's glossary tells this module, the C engine and the engine
process apart.

    template = Template.ensure()                # load, or build once (seconds)
    with template.fork() as sb:                 # copy-on-write, ~10 us
        r = sb.execute("import numpy as np; np.arange(10).sum()")
        r.result["text/plain"]                  # '45'
        child = sb.fork()                       # continues from sb's state; sb is unchanged

Every call runs on the calling thread; Sandbox.interrupt() may be called from another one.
Failures that end a cell's VM raise SandboxCrashed / SandboxTimeout / SandboxMemoryError /
SandboxError; such a sandbox is `broken` until restored from a snapshot.
"""
from .errors import SandboxCrashed, SandboxError, SandboxMemoryError, SandboxTimeout, TemplateError
from .native import Engine, Snapshot
from .sandbox import ExecuteResult, Sandbox
from .template import Template, TemplateConfig

__all__ = ["Engine", "ExecuteResult", "Sandbox", "SandboxCrashed", "SandboxError", "SandboxMemoryError",
           "SandboxTimeout", "Snapshot", "Template", "TemplateConfig", "TemplateError"]
