"""The tool component: tools an agent's model calls between turns.

- `PythonSandbox`: model-generated Python in a bubblewrap sandbox per call
  (no network, no filesystem beyond the interpreter, CPU/memory/output/process limits).
- `calculate`: arithmetic through the `ast`, never `eval`.
- `ToolWorker`: both as a runtime component (`ctl.spawn(ToolWorker, ...)`).
"""
from dynarl.components.tools.calculator import calculate
from dynarl.components.tools.config import ToolConfig
from dynarl.components.tools.latency import LatencyLog
from dynarl.components.tools.outcome import ToolResult
from dynarl.components.tools.python_sandbox import PythonSandbox, SandboxUnavailable
from dynarl.components.tools.worker import ToolWorker

__all__ = ["LatencyLog", "PythonSandbox", "SandboxUnavailable", "ToolConfig", "ToolResult", "ToolWorker",
           "calculate"]
