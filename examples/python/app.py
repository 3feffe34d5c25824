"""The conformance agent of the Sent Voice Agents protocol (protocol.md §9.2), in Python.

It mirrors the Rust agent in examples/conformance, including the commands voicehost's own tests use:

| trigger                              | action                                                                   |
|--------------------------------------|--------------------------------------------------------------------------|
| session start of a text call         | say "Hello from the conformance agent."                                  |
| user-said with `correction`          | `clear()` first (stop if the call has ended), then the command below     |
| "echo <text>"                        | say <text>                                                               |
| "stream <word> <rest>"               | say <word> with `last` false, then say <rest>                            |
| "transfer"                           | tool `transfer` {"to":{"kind":"user","value":"conformance-desk"}}, wait  |
| "hangup"                             | tool `hangup`, no arguments                                              |
| "dtmf <digits>"                      | tool `send_dtmf` {"digits":"<digits>"}                                   |
| "hold"                               | tool `hold` {"held":true}                                                |
| "count"                              | say "utterances: N" (the saved counter, see below)                       |
| "panic"                              | raise an unexpected exception: the instance traps                        |
| any other text                       | nothing                                                                  |
| tool result whose `outcome` is `Err` | say "Tool failed: <error.code>"                                          |
| audio                                | send the same samples back (echo)                                        |

The command is the text up to the first space. If an action is refused with `ENDED`, the agent stops
processing the utterance; other refusals are logged and the next action goes on.

Every user-said first adds one to a counter saved with `session.save("utterances", ...)` as decimal ASCII
(before its command runs, so "panic" and "count" count too). Saved state survives a restart, so
"echo a", "panic", "count" says "utterances: 3" from the fresh instance.

componentize-py maps the WIT world onto Python like this:
* the exported `handler` interface is the class `Handler` below (componentize-py looks it up by that name);
* a handler that returns normally is `ok`; `raise Err("why")` is an `err` (logged by the host, the call
  goes on); any other exception is a trap (the host replaces the instance with a fresh one);
* an imported function returning `result<_, refused>` returns its value or raises `Err(Refused.X)`.
"""

import json
from typing import Callable, TypeVar

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import logging, session
# The world has three `types` interfaces (ours, wasi:http's, wasi:filesystem's): componentize-py names
# each after its package.
from wit_world.imports.voicehost_agent_types import (
    Media_Text,
    Refused,
    RestartReason,
    SessionEnd,
    ToolResult,
    UnknownFrame,
    UserSaid,
)

def log(level: logging.Level, message: str) -> None:
    """Logs `message` at `level` through wasi:logging, with no context."""
    logging.log(level, "", message)


GREETING = "Hello from the conformance agent."
"""What the conformance agent says first in a text call."""

COUNTER_KEY = "utterances"
"""The key of the saved utterance counter."""

T = TypeVar("T")


class CallEnded(Exception):
    """An action was refused with `Refused.ENDED`: nothing more can be done on this call."""


def attempt(action: Callable[..., T], *args: object) -> T | None:
    """Runs one host action. `ENDED` raises `CallEnded`; any other refusal is logged and gives None."""
    try:
        return action(*args)
    except Err as refused:
        if refused.value == Refused.ENDED:
            raise CallEnded() from None
        log(logging.Level.WARN, f"refused: {refused.value.name.lower().replace('_', '-')}")
        return None


def say(text: str, last: bool | None = None) -> None:
    """Speaks `text` (`last` defaults to true on the host's side; interruptible is left to its default)."""
    attempt(session.say, text, last, None)


def use_tool(name: str, arguments: dict | None = None) -> None:
    """Uses one of Sent's tools and waits for its answer (which also reaches `on_tool_result`)."""
    encoded = json.dumps(arguments, separators=(",", ":")) if arguments is not None else None
    attempt(session.tool, name, encoded)


def saved_count() -> int:
    """The saved utterance counter, 0 when nothing (or something unreadable) is saved."""
    saved = session.load(COUNTER_KEY)
    try:
        return int(saved.decode("ascii")) if saved is not None else 0
    except ValueError:
        return 0


def count_utterance() -> None:
    """Adds one to the saved utterance counter."""
    attempt(session.save, COUNTER_KEY, str(saved_count() + 1).encode("ascii"))


def run_command(text: str) -> None:
    """Runs the command in `text`: the word up to the first space, with the rest as its argument."""
    command, _, rest = text.partition(" ")
    if command == "echo":
        say(rest)
    elif command == "stream":
        word, _, remainder = rest.partition(" ")
        say(word, last=False)
        say(remainder)
    elif command == "transfer":
        use_tool("transfer", {"to": {"kind": "user", "value": "conformance-desk"}})
    elif command == "hangup":
        use_tool("hangup")
    elif command == "dtmf":
        use_tool("send_dtmf", {"digits": rest})
    elif command == "hold":
        use_tool("hold", {"held": True})
    elif command == "count":
        say(f"utterances: {saved_count()}")
    elif command == "panic":
        # Not an `Err`: an unexpected exception, which componentize-py turns into a trap.
        raise RuntimeError("asked to panic")


class Handler(exports.Handler):
    """The conformance agent. It keeps nothing in memory: only the saved counter."""

    def on_session_start(self) -> None:
        if isinstance(session.info().media, Media_Text):
            try:
                say(GREETING)
            except CallEnded:
                pass

    def on_user_said(self, said: UserSaid) -> None:
        try:
            count_utterance()
            if said.correction:
                attempt(session.clear)
            run_command(said.text)
        except CallEnded:
            pass  # The call has ended: the rest of the utterance is moot, and there is nothing to report.

    def on_audio(self, samples: list[int]) -> None:
        session.send_audio(samples)

    def on_tool_result(self, answer: ToolResult) -> None:
        # A WIT `result` in a record: `Ok(None)`, or `Err(ToolError)`.
        if isinstance(answer.outcome, Err):
            try:
                say(f"Tool failed: {answer.outcome.value.code}")
            except CallEnded:
                pass

    def on_frame(self, frame: UnknownFrame) -> None:
        pass

    def on_session_end(self, end: SessionEnd) -> None:
        pass

    def on_session_lost(self) -> None:
        pass

    def on_restart(self, reason: RestartReason) -> None:
        log(logging.Level.INFO, f"restarted after: {reason.name.lower().replace('_', '-')}")
