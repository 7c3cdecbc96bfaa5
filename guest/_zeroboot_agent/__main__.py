"""Entry point of the guest agent: `python <guest dir>/_zeroboot_agent --preload numpy,...`.

Running a directory puts that directory first on sys.path, which would make the agent's modules
importable under their bare names (and shadow a user's `agent.py`): the package's parent takes
its place until the package is imported, and the agent then gives the entry to the notebook.
"""
import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from _zeroboot_agent.agent import main  # noqa: E402 - needs the sys.path entry above

sys.exit(main())
