"""A canned Backend for the agent endpoint's HTTP tests (test_agent_server*.py): it stands
in for the sessions only to test the HTTP layer, answering fixed TurnOutputs and recording
what it was asked."""
import asyncio
import contextlib

from dynarl.components.agents.messages import SessionBusy, ToolCall, TurnOutput, UnknownSession
from dynarl.components.agents.server import AgentServer

TOKEN = "tok-3f9a"
LIMIT = 8192
ANSWER = TurnOutput("4", (), "stop", (19, 2), (-0.5, -0.25), ("4", "<|end|>"), 12)
CALLING = TurnOutput("", (ToolCall("call_1", "add", '{"a": 2, "b": 2}'),), "tool_calls",
                     (7, 8, 9), (-0.1, -0.2, -0.3), ("<tool>", "add", "</tool>"), 30)
USER = [{"role": "user", "content": "2+2?"}]


class CannedBackend:
    """Answers by session id: "s1" a turn (`answer`), "busy" SessionBusy, "crash" an
    unexpected error, "slow" waits for `release`; anything else UnknownSession."""

    def __init__(self):
        self.calls = []
        self.answer = ANSWER
        self.release = asyncio.Event()

    async def _turn(self, kind, session, request):
        self.calls.append((kind, session, request))
        if session == "busy":
            raise SessionBusy("session busy has a request under way")
        if session == "crash":
            raise RuntimeError("secret internal detail")
        if session == "slow":
            await self.release.wait()
        elif session != "s1":
            raise UnknownSession(f"no session {session!r}")
        return self.answer

    async def chat(self, session, request):
        return await self._turn("chat", session, request)

    async def complete(self, session, request):
        return await self._turn("complete", session, request)


@contextlib.asynccontextmanager
async def serving(**kw):
    """A started AgentServer on loopback over a CannedBackend; stopped on exit."""
    backend = CannedBackend()
    server = AgentServer(backend, TOKEN, **{"max_body_bytes": LIMIT, "model": "tiny", **kw})
    await server.start()
    try:
        yield server, backend
    finally:
        await server.stop()
