#!/usr/bin/env python3
"""console_pty.py -- drive `qtgd console` in a pseudo-terminal, for
spec/lua/console/console_client_spec.lua (the interactive client: libedit prompt,
Tab completion, continuation prompt, Ctrl-C, Ctrl-D, history file).

    python3 console_pty.py --bin QTGD --socket SOCK --home DIR [--out RESULT.json] \
        [--timeout SECONDS] SESSIONS_JSON

SESSIONS_JSON is a list of sessions; each session is a list of steps, run in
order in one `QTGD console --socket SOCK` started in a fresh pty with
HOME=DIR, TERM=dumb (libedit then redraws a line by rewriting it after a
carriage return, with no cursor escapes), LC_ALL=C and umask 022.  A step is

    {"name": "...", "send": "bytes to type", "expect": "regex"}
    {"name": "...", "send": "\\u0004", "eof": true}

`send` (optional) is written to the terminal as Latin-1 bytes, once the
terminal is in libedit's editing mode (no ICANON, no ECHO), or with
"tty": "cooked" in cooked mode (a command running), or "tty": "any"; then the
output is read until `expect` (a Python regex, searched with re.S|re.M in
the step's output rendered as a terminal shows it: CR/LF, CR and backspace
applied, escape sequences and bells dropped) matches, or, with "eof", until
the client closes the terminal and exits.  Every wait is bounded by
--timeout (default 20 s): there are no fixed sleeps.

The JSON result, {"sessions": [{"steps": [{"name", "text", "raw",
"elapsed"}...], "exit_code", "signal"}...], "history": {"path", "exists",
"mode", "raw", "entries"}} (entries: the history file's lines after libedit's
header, with its \\ooo escapes decoded), goes to stdout, or with --out
to RESULT.json (written by rename, also when a step failed).
Exit status 0 when every step saw what it expected, else 1 with a message
on stderr naming the session and step that timed out and what was read so
far; 2 for a usage error.
"""
import argparse
import errno
import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import sys
import termios
import time

CSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]")


def render(raw):
    """The text a terminal would show for raw output (a str)."""
    lines, line, col = [], [], 0
    for ch in CSI.sub("", raw):
        if ch == "\n":
            lines.append("".join(line).rstrip())
            line, col = [], 0
        elif ch == "\r":
            col = 0
        elif ch == "\b":
            col = max(0, col - 1)
        elif ch == "\x07":
            continue
        else:
            if col < len(line):
                line[col] = ch
            else:
                line.append(ch)
            col += 1
    lines.append("".join(line))
    return "\n".join(lines)


def decode_history(raw):
    """libedit's history file: a _HiStOrY_V2_ header, then one entry a line
    with blanks and control characters as \\ooo (strvis)."""
    lines = raw.split("\n")
    if lines and lines[0].startswith("_HiStOrY_"):
        lines = lines[1:]
    unvis = re.compile(r"\\([0-7]{3}|\\)")
    return [unvis.sub(lambda m: "\\" if m.group(1) == "\\" else chr(int(m.group(1), 8)), l)
            for l in lines if l != ""]


class StepTimeout(Exception):
    pass


class Session:
    def __init__(self, argv, env, timeout):
        self.timeout = timeout
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the console client, on the pty
            try:
                os.umask(0o022)
                os.execve(argv[0], argv, env)
            finally:
                os._exit(127)
        # a wide terminal: no line wrapping in what libedit redraws
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 250, 0, 0))
        self.eof = False
        self.status = None

    def read_some(self, deadline):
        """Bytes available before the deadline (b"" at end of output)."""
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        r, _, _ = select.select([self.fd], [], [], min(left, 0.5))
        if not r:
            return None
        try:
            data = os.read(self.fd, 65536)
        except OSError as e:
            if e.errno != errno.EIO:  # EIO: the client closed the terminal
                raise
            data = b""
        if not data:
            self.eof = True
        return data

    def step(self, step):
        name = step.get("name", "?")
        started = time.monotonic()
        deadline = started + self.timeout
        if step.get("send"):
            self.wait_tty(step.get("tty", "edit"), name, deadline)
            os.write(self.fd, step["send"].encode("latin-1"))
        raw = b""
        pattern = re.compile(step["expect"], re.S | re.M) if step.get("expect") else None
        if not pattern and not step.get("eof"):
            raise StepTimeout((name, "the step has neither expect nor eof", raw))
        while True:
            text = render(raw.decode("utf-8", "replace"))
            if pattern and pattern.search(text):
                break
            if step.get("eof") and self.eof:
                self.wait_exit(deadline)
                break
            if self.eof and pattern:
                raise StepTimeout((name, "the client closed the terminal before /%s/ appeared"
                                   % step["expect"], raw))
            if time.monotonic() > deadline:
                what = "/%s/" % step["expect"] if pattern else "the client to exit"
                raise StepTimeout((name, "timed out after %g s waiting for %s" % (self.timeout, what),
                                   raw))
            data = self.read_some(deadline)
            if data:
                raw += data
        return {"name": name, "text": text, "raw": raw.decode("utf-8", "replace"),
                "elapsed": round(time.monotonic() - started, 3)}

    def wait_tty(self, want, name, deadline):
        """Wait until the terminal is in the mode `want`: "edit" (libedit
        reading a line: no canonical input, no echo) or "cooked" (a command
        running).  libedit prints its prompt before it switches the terminal
        to its mode, so what is typed the instant the prompt shows would be
        echoed by the terminal and again by libedit, and a Ctrl-C then
        would be the terminal's, not the line editor's."""
        if want == "any":
            return
        while True:
            lflag = termios.tcgetattr(self.fd)[3]
            edit = not (lflag & (termios.ICANON | termios.ECHO))
            if edit == (want == "edit"):
                return
            if time.monotonic() > deadline:
                raise StepTimeout((name, "timed out after %g s waiting for the terminal's %s mode"
                                   % (self.timeout, want), b""))
            select.select([], [], [], 0.002)

    def wait_exit(self, deadline):
        while self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.status = status
                return
            if time.monotonic() > deadline:
                raise StepTimeout(("exit", "the client closed the terminal but did not exit", b""))
            select.select([], [], [], 0.02)

    def close(self):
        """Kill the client if it is still there (a failed step), reap it."""
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _, self.status = os.waitpid(self.pid, 0)
        os.close(self.fd)
        if os.WIFEXITED(self.status):
            return {"exit_code": os.WEXITSTATUS(self.status), "signal": None}
        return {"exit_code": None, "signal": os.WTERMSIG(self.status)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--home", required=True)
    ap.add_argument("--out", help="write the JSON result here (by rename), not to stdout")
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("sessions")
    args = ap.parse_args()
    sessions = json.loads(args.sessions)

    env = {k: v for k, v in os.environ.items() if not k.startswith("LC_")}
    env.update(HOME=args.home, TERM="dumb", LC_ALL="C", COLUMNS="250", LINES="50")
    argv = [args.bin, "console", "--socket", args.socket]

    result = {"sessions": []}
    failure = None
    for si, steps in enumerate(sessions):
        s = Session(argv, env, args.timeout)
        seen = []
        try:
            for st in steps:
                seen.append(s.step(st))
        except StepTimeout as e:
            name, why, raw = e.args[0]
            failure = "session %d, step '%s': %s; read so far in this step: %r" % (
                si + 1, name, why, raw.decode("utf-8", "replace"))
            seen.append({"name": name, "failed": why, "raw": raw.decode("utf-8", "replace"),
                         "text": render(raw.decode("utf-8", "replace"))})
        finally:
            rec = s.close()
        rec["steps"] = seen
        result["sessions"].append(rec)
        if failure:
            break

    path = os.path.join(args.home, ".qtg_console_history")
    hist = {"path": path, "exists": os.path.exists(path)}
    if hist["exists"]:
        hist["mode"] = "%o" % (os.stat(path).st_mode & 0o7777)
        with open(path, "rb") as f:
            hist["raw"] = f.read().decode("utf-8", "replace")
        hist["entries"] = decode_history(hist["raw"])
    result["history"] = hist
    if failure:
        result["failure"] = failure

    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out + ".tmp", "w") as f:
            f.write(text)
        os.rename(args.out + ".tmp", args.out)
    else:
        print(text)
    if failure:
        print("console_pty: " + failure, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
