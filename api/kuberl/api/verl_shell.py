"""A verl launch script read as bash would run it, for what verl's scripts use: the launch command's words.

Handled as bash does: `X=…`, `export`/`readonly`/`declare`, arrays (`A=(…)`, `"${A[@]}"`), `$X`, `${X}`,
`${X:-default}` and the other default/alternative forms, `${X//a/b}`, `${X#…}`/`${X%…}`, `${#X}`, case changes,
`$((…))` on integers, quotes and escapes, word splitting, `&&` (both sides run), `||` (the right side is skipped),
and `if` with `[ … ]`/`[[ … ]]` tests on strings and integers.

Not run, by design: command substitutions (`$(…)`, backticks), sourced files, loops, functions, `case`. A value
that depends on one is an `Unknown` that says why, on which line, and which variable to pass with `--env` instead;
the import fails only if a key it needs holds one. The caller's own environment is never read: a laptop's `$HOME`
means nothing in a pod, so what a script reads from the environment comes from `--env KEY=VALUE`.
"""

from __future__ import annotations

import ast
import contextlib
import fnmatch
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NoReturn

NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_ASSIGNMENT = re.compile(rf"^({NAME})(\+?)=(.*)$", re.DOTALL)
_ARRAY_OPEN = re.compile(rf"^({NAME})(\+?)=$")
_OPERATORS = ("&&", "||", ";;", "|&", ";", "|", "&", "(", ")")
_REDIRECTION = re.compile(r"^(\d*|&)(>>|>&|<<<|<<-|<<|<&|>|<)")
_KEYWORDS_END = {"then", "elif", "else", "fi", "do", "done", "esac", "}"}
_WRAPPERS = {"nohup", "exec", "time", "stdbuf", "unbuffer", "command"}
_LAUNCHERS = {"srun", "mpirun", "numactl", "taskset"}  # [options] then the program
_PYTHON = re.compile(r"^(.*/)?(python(\d+(\.\d+)?)?|torchrun|accelerate)$")
_OVERRIDE_WORD = re.compile(r"^(\+\+|\+|~)?[A-Za-z_][\w]*(\.[\w@-]+)+(=|$)")


class ShellError(ValueError):
    """A script kuberl cannot read: names the line and what to do."""


@dataclass(frozen=True)
class Unknown:
    """A value kuberl does not compute: why, on which line, and the variable `--env` should set instead."""

    reason: str
    line: int
    variable: str | None = None
    written: str = ""
    """The value as the script wrote it (`${NNODES}`), where it reached a key."""

    def fix(self) -> str:
        if self.variable is None:
            return "write the value into the script, or give KEY=VALUE after the script"
        name = self.variable
        if name.isdigit():
            return f"pass --env {name}=VALUE (the script's positional argument ${name})"
        return f"pass --env {name}=VALUE"

    def __str__(self) -> str:
        return f"{self.reason} (line {self.line}): {self.fix()}"


Value = str | list[str] | Unknown
Field = str | Unknown


@dataclass(frozen=True)
class Word:
    """One launch-command word: as written (`raw`) and as bash would pass it (a string, or Unknown)."""

    raw: str
    value: Field


@dataclass
class Launch:
    """The command that starts verl: `python3 -m ENTRY ARGS…` (also under torchrun, `ray job submit -- …`)."""

    line: int
    entry: str
    """The module (`verl.trainer.main_ppo`) or script file (`main_ppo_split.py`) it runs."""
    args: list[Word]
    environment: dict[str, Field]
    """What the command's environment adds: exported variables and `KEY=VALUE` written before the command."""
    conditional: str | None = None
    """Why kuberl cannot tell whether this command runs (inside a loop, a function, an undecidable `if`)."""


@dataclass
class Script:
    launches: list[Launch]
    notes: list[str] = field(default_factory=list)


def read_script(text: str, env: dict[str, str] | None = None) -> Script:
    """Run `text` as far as kuberl runs bash, with `env` as the environment; every launch command it reaches."""
    tokens = list(_Lexer(text).tokens())
    nodes = _Parser(tokens).parse()
    runner = _Runner(dict(env or {}))
    with contextlib.suppress(_Stop):
        runner.block(nodes)
    return Script(runner.launches, runner.notes)


# --- lexer -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Token:
    kind: str
    """word, op, newline, array (text = name, items = raw words), redirect"""
    text: str
    line: int
    items: tuple[str, ...] = ()
    append: bool = False


class _Lexer:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.line = 1
        self.in_test = False
        self.heredocs: list[tuple[str, bool]] = []

    def fail(self, what: str) -> NoReturn:
        raise ShellError(f"line {self.line}: {what}")

    def peek(self, n: int = 0) -> str:
        """The character `n` ahead, or "\\0" past the end (so that `in` tests on it are false)."""
        i = self.pos + n
        return self.text[i] if i < len(self.text) else "\0"

    def advance(self, n: int = 1) -> str:
        chunk = self.text[self.pos : self.pos + n]
        self.line += chunk.count("\n")
        self.pos += n
        return chunk

    def tokens(self) -> Iterator[_Token]:
        while self.pos < len(self.text):
            c = self.peek()
            if c == "\\" and self.peek(1) == "\n":
                self.advance(2)
            elif c in " \t\r":
                self.advance()
            elif c == "#":
                while self.pos < len(self.text) and self.peek() != "\n":
                    self.advance()
            elif c == "\n":
                yield _Token("newline", "\n", self.line)
                self.advance()
                self.skip_heredocs()
            elif self.in_test and self.text.startswith(("&&", "||"), self.pos):
                yield _Token("word", self.advance(2), self.line)
            elif (m := _REDIRECTION.match(self.text[self.pos :])) and (m.group(1) or c in "<>"):
                line = self.line
                op = self.advance(len(m.group(0)))
                if self.peek() in "&":  # 2>&1, >&2
                    self.advance()
                while self.peek() in " \t":
                    self.advance()
                target = self.word() if self.peek() not in "\n;|&" else ""
                if op.endswith(("<<", "<<-")) and not op.endswith("<<<"):
                    quoted = any(q in target for q in "'\"\\")
                    self.heredocs.append((re.sub(r"['\"\\]", "", target), quoted))
                yield _Token("redirect", op + target, line)
            elif operator := next((o for o in _OPERATORS if self.text.startswith(o, self.pos)), None):
                yield _Token("op", operator, self.line)
                self.advance(len(operator))
            else:
                line = self.line
                word = self.word()
                if (m := _ARRAY_OPEN.match(word)) and self.peek() == "(":
                    self.advance()
                    yield _Token("array", m.group(1), line, tuple(self.array_items()), append=bool(m.group(2)))
                    continue
                if word == "[[":
                    self.in_test = True
                elif word == "]]":
                    self.in_test = False
                yield _Token("word", word, line)

    def skip_heredocs(self) -> None:
        for delimiter, _ in self.heredocs:
            while self.pos < len(self.text):
                end = self.text.find("\n", self.pos)
                end = len(self.text) if end < 0 else end
                body_line = self.text[self.pos : end]
                self.advance(end - self.pos + 1)
                if body_line.strip() == delimiter:
                    break
        self.heredocs.clear()

    def array_items(self) -> Iterator[str]:
        while True:
            c = self.peek()
            if c == "\0":
                self.fail("an array `(` is never closed")
            if c == ")":
                self.advance()
                return
            if c in " \t\r\n":
                self.advance()
            elif c == "\\" and self.peek(1) == "\n":
                self.advance(2)
            elif c == "#":
                while self.peek() not in "\n\0":
                    self.advance()
            else:
                yield self.word()

    def word(self) -> str:
        """One word, quotes and expansions kept as written."""
        start = self.pos
        while self.pos < len(self.text):
            c = self.peek()
            if c in " \t\r\n;&|<>()":
                break
            if c == "\\":
                if self.peek(1) == "\n":
                    break
                self.advance(2)
            elif c == "'":
                self.quoted("'")
            elif c == '"':
                self.quoted('"')
            elif c == "`":
                self.quoted("`")
            elif c == "$" and self.peek(1) in "({":
                self.dollar()
            else:
                self.advance()
        return self.text[start : self.pos]

    def quoted(self, quote: str) -> None:
        opened = self.line
        self.advance()
        while True:
            c = self.peek()
            if c == "\0":
                raise ShellError(f"line {opened}: a {quote} quote opened here is never closed")
            if c == quote:
                self.advance()
                return
            if c == "\\" and quote != "'":
                self.advance(2)
            elif c == "$" and quote == '"' and self.peek(1) in "({":
                self.dollar()
            else:
                self.advance()

    def dollar(self) -> None:
        """`$(…)`, `$((…))` or `${…}`, nested quotes and expansions included."""
        self.advance()
        close = ")" if self.peek() == "(" else "}"
        opening = self.peek()
        self.advance()
        depth = 1
        while depth:
            c = self.peek()
            if c == "\0":
                self.fail(f"a `${opening}` is never closed")
            if c in "'\"`" and not (c == "'" and close == "}"):
                self.quoted(c)
                continue
            if c == "\\":
                self.advance(2)
                continue
            if c == "$" and self.peek(1) in "({":
                self.dollar()
                continue
            if c == opening:
                depth += 1
            elif c == close:
                depth -= 1
            self.advance()


# --- parser ------------------------------------------------------------------------------------------------------


@dataclass
class _Simple:
    words: list[str]
    line: int


@dataclass
class _ArrayAssign:
    name: str
    items: tuple[str, ...]
    append: bool
    line: int


@dataclass
class _If:
    branches: list[tuple[list[_Node], list[_Node]]]
    otherwise: list[_Node] | None
    line: int


@dataclass
class _Opaque:
    """A construct kuberl does not run (loop, function, case, subshell): its body is read for what it would set."""

    kind: str
    body: list[_Node]
    line: int


@dataclass
class _AndOr:
    first: list[_Node]
    rest: list[tuple[str, list[_Node]]]


_Node = _Simple | _ArrayAssign | _If | _Opaque | _AndOr


class _Parser:
    def __init__(self, tokens: list[_Token]) -> None:
        self.tokens = tokens
        self.i = 0

    def peek(self) -> _Token | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> _Token:
        token = self.tokens[self.i]
        self.i += 1
        return token

    def at_word(self, *words: str) -> bool:
        token = self.peek()
        return token is not None and token.kind == "word" and token.text in words

    def expect(self, word: str, opened: _Token) -> None:
        if not self.at_word(word):
            raise ShellError(f"line {opened.line}: `{opened.text}` has no matching `{word}`")
        self.take()

    def parse(self) -> list[_Node]:
        nodes = self.block(set())
        if (token := self.peek()) is not None:
            raise ShellError(f"line {token.line}: unexpected `{token.text}`")
        return nodes

    def block(self, until: set[str]) -> list[_Node]:
        nodes: list[_Node] = []
        while (token := self.peek()) is not None:
            if token.kind == "newline" or (token.kind == "op" and token.text in (";", "&", ";;")):
                self.take()
            elif (token.kind == "word" and token.text in until) or (
                token.kind == "op" and token.text == ")" and ")" in until
            ):
                return nodes
            elif token.kind == "word" and token.text in _KEYWORDS_END:
                raise ShellError(f"line {token.line}: unexpected `{token.text}`")
            else:
                nodes.append(self.and_or())
        return nodes

    def and_or(self) -> _Node:
        first = self.pipeline()
        rest: list[tuple[str, list[_Node]]] = []
        while (token := self.peek()) is not None and token.kind == "op" and token.text in ("&&", "||"):
            self.take()
            while (t := self.peek()) is not None and t.kind == "newline":
                self.take()
            rest.append((token.text, self.pipeline()))
        return _AndOr(first, rest) if rest else _AndOr(first, [])

    def pipeline(self) -> list[_Node]:
        commands = [self.command()]
        while (token := self.peek()) is not None and token.kind == "op" and token.text in ("|", "|&"):
            self.take()
            while (t := self.peek()) is not None and t.kind == "newline":
                self.take()
            commands.append(self.command())
        return commands

    def command(self) -> _Node:
        token = self.peek()
        assert token is not None
        if token.kind == "word" and token.text == "if":
            return self.if_clause()
        if token.kind == "word" and token.text in ("for", "while", "until", "select"):
            self.take()
            while not self.at_word("do"):
                if self.peek() is None:
                    raise ShellError(f"line {token.line}: `{token.text}` has no `do`")
                self.take()
            self.take()
            body = self.block({"done"})
            self.expect("done", token)
            return _Opaque(f"{token.text} loop", body, token.line)
        if token.kind == "word" and token.text == "case":
            return self.case_clause()
        if token.kind == "word" and token.text == "{":
            self.take()
            body = self.block({"}"})
            self.expect("}", token)
            return _AndOr([*body], []) if body else _Simple([], token.line)
        if token.kind == "op" and token.text == "(":
            self.take()
            body = self.block({")"})
            if (t := self.peek()) is None or t.text != ")":
                raise ShellError(f"line {token.line}: `(` has no matching `)`")
            self.take()
            return _Opaque("subshell", body, token.line)
        if token.kind == "word" and token.text == "function":
            self.take()
            name = self.take()
            return self.function_body(name.text.removesuffix("()"), token)
        if token.kind == "array":
            self.take()
            return _ArrayAssign(token.text, token.items, token.append, token.line)
        nxt = self.tokens[self.i + 1] if self.i + 1 < len(self.tokens) else None
        if token.kind == "word" and nxt is not None and nxt.kind == "op" and nxt.text == "(":
            self.take()
            self.take()
            if (t := self.peek()) is None or t.text != ")":
                raise ShellError(f"line {token.line}: `{token.text}(` is neither a function nor a command")
            self.take()
            return self.function_body(token.text, token)
        words: list[str] = []
        while (t := self.peek()) is not None and t.kind in ("word", "redirect", "array"):
            self.take()
            if t.kind == "word":
                words.append(t.text)
        return _Simple(words, token.line)

    def function_body(self, name: str, opened: _Token) -> _Node:
        while (t := self.peek()) is not None and t.kind == "newline":
            self.take()
        if (t := self.peek()) is not None and t.kind == "op" and t.text == "(":
            self.take()
            if (t := self.peek()) is not None and t.kind == "op" and t.text == ")":
                self.take()
        while (t := self.peek()) is not None and t.kind == "newline":
            self.take()
        body = self.command()
        return _Opaque(f"function {name}", [body], opened.line)

    def if_clause(self) -> _Node:
        opened = self.take()
        branches: list[tuple[list[_Node], list[_Node]]] = []
        otherwise: list[_Node] | None = None
        while True:
            condition = self.block({"then"})
            self.expect("then", opened)
            body = self.block({"elif", "else", "fi"})
            branches.append((condition, body))
            if self.at_word("elif"):
                self.take()
                continue
            if self.at_word("else"):
                self.take()
                otherwise = self.block({"fi"})
            self.expect("fi", opened)
            return _If(branches, otherwise, opened.line)

    def case_clause(self) -> _Node:
        opened = self.take()
        body: list[_Node] = []
        while not self.at_word("esac"):
            token = self.peek()
            if token is None:
                raise ShellError(f"line {opened.line}: `case` has no `esac`")
            self.take()
            if token.kind == "word" and _ASSIGNMENT.match(token.text):
                body.append(_Simple([token.text], token.line))
        self.take()
        return _Opaque("case", body, opened.line)


# --- running -----------------------------------------------------------------------------------------------------


class _Stop(Exception):
    """`exit` reached where the script certainly runs."""


@dataclass
class _Part:
    """A piece of a word after expansion: text, or an array's items; quoted parts are never split."""

    text: str | list[str]
    quoted: bool


class _Runner:
    def __init__(self, env: dict[str, str]) -> None:
        self.given = env
        self.vars: dict[str, Value] = {k: v for k, v in env.items() if not k.isdigit()}
        self.positional = [env[str(i)] for i in range(1, 10) if str(i) in env]
        self.exported: dict[str, Field] = {}
        self.launches: list[Launch] = []
        self.notes: list[str] = []
        self.uncertain: str | None = None
        """Why the commands being run may not run (inside a loop, a function, an undecidable if)."""

    # -- statements --

    def block(self, nodes: list[_Node]) -> None:
        try:
            for node in nodes:
                self.node(node)
        except _Stop:
            if self.uncertain is not None:
                return
            raise

    def node(self, node: _Node) -> None:
        if isinstance(node, _AndOr):
            self.block(node.first)
            for op, commands in node.rest:
                if op == "&&":  # a command is assumed to succeed: `||` branches do not run
                    self.block(commands)
        elif isinstance(node, _Simple):
            self.simple(node)
        elif isinstance(node, _ArrayAssign):
            self.array_assign(node)
        elif isinstance(node, _If):
            self.if_clause(node)
        else:
            self.opaque(node.body, f"inside the {node.kind} at line {node.line}, which kuberl does not run")

    def opaque(self, body: list[_Node], why: str) -> None:
        saved = self.uncertain
        self.uncertain = saved or why
        try:
            self.block(body)
        except _Stop:
            pass
        finally:
            self.uncertain = saved

    def if_clause(self, node: _If) -> None:
        for condition, body in node.branches:
            verdict = self.test(condition)
            if verdict is None:
                why = f"inside the if at line {node.line}, whose condition kuberl cannot decide"
                for _, branch in node.branches:
                    self.opaque(branch, why)
                if node.otherwise is not None:
                    self.opaque(node.otherwise, why)
                return
            if verdict:
                self.block(body)
                return
        if node.otherwise is not None:
            self.block(node.otherwise)

    def test(self, condition: list[_Node]) -> bool | None:
        """`[ … ]`, `[[ … ]]`, `test …` with string and integer comparisons; None: kuberl cannot tell."""
        if len(condition) != 1 or not isinstance(condition[0], _AndOr):
            return None
        and_or = condition[0]
        if len(and_or.first) != 1 or not isinstance(and_or.first[0], _Simple):
            return None
        result = self.one_test(and_or.first[0])
        for op, commands in and_or.rest:
            if len(commands) != 1 or not isinstance(commands[0], _Simple):
                return None
            other = self.one_test(commands[0])
            if result is None or other is None:
                return None
            result = (result and other) if op == "&&" else (result or other)
        return result

    def one_test(self, command: _Simple) -> bool | None:
        words = command.words
        if not words or words[0] not in ("[", "[[", "test"):
            return None
        if (words[0] == "[" and words[-1] == "]") or (words[0] == "[[" and words[-1] == "]]"):
            words = words[1:-1]
        elif words[0] == "test":
            words = words[1:]
        else:
            return None
        negate = bool(words) and words[0] == "!"
        words = words[1:] if negate else words
        fields: list[str] = []
        for raw in words:
            expanded = self.expand(raw, command.line, split=False)
            if any(isinstance(f, Unknown) for f in expanded):
                return None
            fields.append("".join(f for f in expanded if isinstance(f, str)))
        verdict = _evaluate_test(fields)
        return None if verdict is None else verdict != negate

    def simple(self, node: _Simple) -> None:
        words = node.words
        assignments: list[tuple[str, bool, str]] = []
        while words and (m := _ASSIGNMENT.match(words[0])):
            assignments.append((m.group(1), bool(m.group(2)), m.group(3)))
            words = words[1:]
        if not words:
            for name, append, raw in assignments:
                self.assign(name, self.expand_scalar(raw, node.line), node.line, append)
            return
        prefix = {name: self.expand_scalar(raw, node.line) for name, _, raw in assignments}
        command = words[0]
        if command in ("export", "readonly", "declare", "typeset", "local"):
            self.declare(words[1:], node.line, exported=command in ("export",) or "-x" in words)
            return
        if command == "unset":
            for name in words[1:]:
                self.vars.pop(name, None)
                self.exported.pop(name, None)
            return
        if command == "exit" and self.uncertain is None:
            self.notes.append(f"the script exits at line {node.line}; what follows is not read")
            raise _Stop
        if command == "shift":
            count = int(words[1]) if len(words) > 1 and words[1].isdigit() else 1
            self.positional = self.positional[count:]
            return
        if command in ("source", "."):
            self.notes.append(f"line {node.line}: `{' '.join(words)}` is not read; what it sets is unset here")
            return
        if command == "read":
            for name in (w for w in words[1:] if re.fullmatch(NAME, w)):
                self.vars[name] = Unknown(f"{name} is read from input", node.line, name)
            return
        fields: list[Word] = []
        for raw in words:
            for value in self.expand(raw, node.line, split=True):
                fields.append(Word(raw, value))
        launch = _launch_of(fields, node.line)
        if launch is not None:
            launch.environment = {**self.exported, **prefix, **launch.environment}
            launch.conditional = self.uncertain
            self.launches.append(launch)

    def declare(self, args: list[str], line: int, exported: bool) -> None:
        for arg in args:
            if arg.startswith("-"):
                continue
            if m := _ASSIGNMENT.match(arg):
                self.assign(m.group(1), self.expand_scalar(m.group(3), line), line, bool(m.group(2)))
                name = m.group(1)
            elif re.fullmatch(NAME, arg):
                name = arg
            else:
                continue
            if exported:
                value = self.vars.get(name, "")
                self.exported[name] = " ".join(value) if isinstance(value, list) else value

    def assign(self, name: str, value: Field, line: int, append: bool = False) -> None:
        if self.uncertain is not None:
            value = Unknown(f"{name} is set {self.uncertain}", line, name)
        elif isinstance(value, Unknown):
            value = Unknown(value.reason, value.line, value.variable or name)
        if isinstance(value, Unknown) and name in self.given:
            value = self.given[name]  # --env: the value kuberl cannot compute
        if append and isinstance(value, str):
            old = self.vars.get(name, "")
            value = old if isinstance(old, Unknown) else ("".join(old) if isinstance(old, list) else old) + value
        self.vars[name] = value
        if name in self.exported:
            self.exported[name] = value

    def array_assign(self, node: _ArrayAssign) -> None:
        items: list[str] = []
        for raw in node.items:
            for value in self.expand(raw, node.line, split=True):
                if isinstance(value, Unknown):
                    self.assign(node.name, value, node.line)
                    return
                items.append(value)
        if self.uncertain is not None:
            self.assign(node.name, "", node.line)
            return
        old = self.vars.get(node.name)
        self.vars[node.name] = (old if isinstance(old, list) and node.append else []) + items

    # -- expansion --

    def expand_scalar(self, raw: str, line: int) -> Field:
        """An assignment's value: expanded, never split; arrays joined by spaces."""
        fields = self.expand(raw, line, split=False)
        unknown = next((f for f in fields if isinstance(f, Unknown)), None)
        return unknown or " ".join(f for f in fields if isinstance(f, str))

    def expand(self, raw: str, line: int, split: bool) -> list[Field]:
        """The fields bash makes of one word (several when split or for `"${A[@]}"`; none for an empty `$X`)."""
        try:
            parts = list(self.parts(raw, line, quoted=False))
        except _Unexpanded as exc:
            return [exc.unknown]
        fields: list[str] = []
        current: str | None = None
        for part in parts:
            if isinstance(part.text, list):
                if not part.text:
                    continue
                first, *more = part.text
                current = (current or "") + first
                if more:
                    fields.append(current)
                    fields.extend(more[:-1])
                    current = more[-1]
            elif part.quoted or not split:
                current = (current or "") + part.text
            else:
                pieces = re.split(r"[ \t\n]+", part.text)
                if pieces[0]:
                    current = (current or "") + pieces[0]
                for piece in pieces[1:]:
                    if current is not None:
                        fields.append(current)
                    current = piece or None
        if current is not None:
            fields.append(current)
        return list(fields)

    def parts(self, raw: str, line: int, quoted: bool) -> Iterator[_Part]:
        i = 0
        literal = ""
        while i < len(raw):
            c = raw[i]
            if c == "\\" and i + 1 < len(raw):
                nxt = raw[i + 1]
                literal += nxt if not quoted or nxt in '$`"\\\n' else c + nxt
                i += 2
            elif c == "'" and not quoted:
                end = raw.index("'", i + 1)
                if literal:
                    yield _Part(literal, quoted)
                    literal = ""
                yield _Part(raw[i + 1 : end], True)
                i = end + 1
            elif c == '"' and not quoted:
                end = _closing_quote(raw, i)
                if literal:
                    yield _Part(literal, quoted)
                    literal = ""
                inner = list(self.parts(raw[i + 1 : end], line, quoted=True))
                yield from inner or [_Part("", True)]
                i = end + 1
            elif c == "`":
                end = raw.index("`", i + 1)
                raise _Unexpanded(
                    Unknown(f"`{raw[i : end + 1]}` is a command substitution, which kuberl does not run", line)
                )
            elif c == "$" and i + 1 < len(raw):
                end, value = self.dollar(raw, i, line, quoted)
                if value is None:
                    literal += c
                    i += 1
                    continue
                if literal:
                    yield _Part(literal, quoted)
                    literal = ""
                yield _Part(value, quoted)
                i = end
            else:
                literal += c
                i += 1
        if literal:
            yield _Part(literal, quoted)

    def dollar(self, raw: str, i: int, line: int, quoted: bool) -> tuple[int, str | list[str] | None]:
        """The expansion starting at raw[i] == '$': (index after it, its value); value None: a literal `$`."""
        nxt = raw[i + 1]
        if raw.startswith("$((", i):
            end = _matching(raw, i + 1, "(", ")")
            return end + 1, str(self.arithmetic(raw[i + 3 : end - 1], line))
        if nxt == "(":
            end = _matching(raw, i + 1, "(", ")")
            text = raw[i : end + 1]
            raise _Unexpanded(Unknown(f"`{text}` is a command substitution, which kuberl does not run", line))
        if nxt == "{":
            end = _matching(raw, i + 1, "{", "}")
            return end + 1, self.braced(raw[i + 2 : end], line, quoted)
        if m := re.match(NAME, raw[i + 1 :]):
            return i + 1 + m.end(), self.lookup(m.group(0), line)
        if nxt.isdigit():
            return i + 2, self.positional_value(int(nxt), line)
        if nxt in "@*":
            return i + 2, list(self.positional) if nxt == "@" and quoted else " ".join(self.positional)
        if nxt == "#":
            return i + 2, str(len(self.positional))
        if nxt == "?":
            return i + 2, "0"
        if nxt in "$!0-":
            raise _Unexpanded(Unknown(f"${nxt} is the shell's own (a process id, the script name or flags)", line))
        return i + 1, None

    def positional_value(self, index: int, line: int) -> str:
        if index == 0:
            raise _Unexpanded(Unknown("$0 is the script's own path", line))
        if index <= len(self.positional):
            return self.positional[index - 1]
        raise _Unexpanded(Unknown(f"${index} is the script's argument, not given", line, str(index)))

    def lookup(self, name: str, line: int) -> str | list[str]:
        value = self.vars.get(name)
        if value is None:
            raise _Unexpanded(Unknown(f"{name} is not set in the script", line, name))
        if isinstance(value, Unknown):
            raise _Unexpanded(value)
        return value

    def braced(self, body: str, line: int, quoted: bool) -> str | list[str]:
        """`${…}`: the forms verl's scripts use; others are refused with the form named."""
        if body.startswith("#") and re.fullmatch(NAME, body[1:]):
            value = self.lookup(body[1:], line)
            return str(len(value))
        if m := re.fullmatch(r"([@*]):(\d+)(?::(\d+))?", body):  # ${@:2}: the arguments from the second on
            start = max(int(m.group(2)) - 1, 0)
            end = start + int(m.group(3)) if m.group(3) else None
            items = self.positional[start:end]
            return items if quoted and m.group(1) == "@" else " ".join(items)
        m = re.match(rf"^({NAME}|\d+)(\[(@|\*|\d+)\])?", body)
        if m is None:
            raise _Unexpanded(Unknown(f"`${{{body}}}` is a form of expansion kuberl does not read", line))
        name, index, rest = m.group(1), m.group(3), body[m.end() :]
        if name.isdigit():
            current: Value | None = self.positional[int(name) - 1] if 0 < int(name) <= len(self.positional) else None
        else:
            current = self.vars.get(name)
        if isinstance(current, Unknown):
            raise _Unexpanded(current)
        if index is not None:
            if isinstance(current, list):
                current = current if index in "@*" else (current[int(index)] if int(index) < len(current) else "")
            elif isinstance(current, str) and index not in "@*" and index != "0":
                current = ""
        if rest == "":
            if current is None:
                raise _Unexpanded(Unknown(f"{name} is not set in the script", line, name))
            if isinstance(current, list):
                return current if quoted and index == "@" else " ".join(current)
            return current
        op = re.match(r"^(:-|:=|:\+|:\?|-|=|\+|\?|//|/|##|#|%%|%|,,|\^\^|,|\^)", rest)
        if op is None:
            raise _Unexpanded(Unknown(f"`${{{body}}}` is a form of expansion kuberl does not read", line))
        word = rest[op.end() :]
        kind = op.group(1)
        unset = current is None
        empty = unset or current in ("", [])
        if kind in (":-", "-", ":=", "="):
            if empty if kind.startswith(":") else unset:
                try:
                    value = self.expand_scalar_strict(word, line)
                except _Unexpanded as exc:
                    raise _Unexpanded(
                        Unknown(
                            f"{name} is not set and its default cannot be computed ({exc.unknown.reason})", line, name
                        )
                    ) from exc
                if kind.endswith("="):
                    self.assign(name, value, line)
                return value
            assert current is not None
            return current if isinstance(current, str) else " ".join(current)
        if kind in (":+", "+"):
            return "" if (empty if kind == ":+" else unset) else self.expand_scalar_strict(word, line)
        if kind in (":?", "?"):
            if empty if kind == ":?" else unset:
                raise _Unexpanded(Unknown(f"{name} is required by the script ({word or 'not set'})", line, name))
            assert isinstance(current, (str, list))
            return current if isinstance(current, str) else " ".join(current)
        if current is None:
            raise _Unexpanded(Unknown(f"{name} is not set in the script", line, name))
        text = current if isinstance(current, str) else " ".join(current)
        if kind in ("//", "/"):
            pattern, _, replacement = word.partition("/")
            pattern = self.expand_scalar_strict(pattern, line)
            replacement = self.expand_scalar_strict(replacement, line)
            return text.replace(pattern, replacement) if kind == "//" else text.replace(pattern, replacement, 1)
        if kind in (",,", ",", "^^", "^"):
            return text.lower() if kind.startswith(",") else text.upper()
        pattern = self.expand_scalar_strict(word, line)
        return _trim(text, pattern, kind)

    def expand_scalar_strict(self, raw: str, line: int) -> str:
        value = self.expand_scalar(raw, line)
        if isinstance(value, Unknown):
            raise _Unexpanded(value)
        return value

    def arithmetic(self, expression: str, line: int) -> int:
        """`$((…))` over integers: + - * / % ** and parentheses; names are variables holding integers."""
        text = self.expand_scalar_strict(expression, line)

        def value_of(name: str) -> int:
            value = self.lookup(name, line)
            if isinstance(value, list) or not re.fullmatch(r"\s*-?\d+\s*", value):
                raise _Unexpanded(Unknown(f"$(({expression})) reads {name}={value!r}, not an integer", line, name))
            return int(value)

        try:
            tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError as exc:
            raise _Unexpanded(Unknown(f"$(({expression})) is not integer arithmetic kuberl reads", line)) from exc
        return _integer(tree.body, value_of, expression, line)


class _Unexpanded(Exception):
    def __init__(self, unknown: Unknown) -> None:
        super().__init__(unknown.reason)
        self.unknown = unknown


_BINARY: dict[type, Callable[[int, int], int]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1),  # C's truncation, as bash
    ast.Mod: lambda a, b: abs(a) % abs(b) * (1 if a >= 0 else -1),
    ast.Pow: lambda a, b: a**b,
}


def _integer(node: ast.expr, value_of: Callable[[str], int], expression: str, line: int) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name):
        return value_of(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _integer(node.operand, value_of, expression, line)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left = _integer(node.left, value_of, expression, line)
        right = _integer(node.right, value_of, expression, line)
        if isinstance(node.op, (ast.Div, ast.Mod)) and right == 0:
            raise _Unexpanded(Unknown(f"$(({expression})) divides by zero", line))
        return _BINARY[type(node.op)](left, right)
    raise _Unexpanded(Unknown(f"$(({expression})) is not integer arithmetic kuberl reads", line))


def _evaluate_test(words: list[str]) -> bool | None:
    if len(words) == 1:
        return words[0] != ""
    if len(words) == 2 and words[0] in ("-z", "-n"):
        return (words[1] == "") == (words[0] == "-z")
    if len(words) == 3:
        left, op, right = words
        if op in ("=", "=="):
            return fnmatch.fnmatchcase(left, right)
        if op == "!=":
            return not fnmatch.fnmatchcase(left, right)
        numeric = {"-eq": int.__eq__, "-ne": int.__ne__, "-lt": int.__lt__, "-le": int.__le__}
        numeric |= {"-gt": int.__gt__, "-ge": int.__ge__}
        if op in numeric and re.fullmatch(r"-?\d+", left) and re.fullmatch(r"-?\d+", right):
            return bool(numeric[op](int(left), int(right)))
    return None


def _trim(text: str, pattern: str, kind: str) -> str:
    """`${X#p}` `${X##p}` (shortest/longest prefix) and `${X%p}` `${X%%p}` (suffix), glob patterns."""
    indices = range(len(text) + 1)
    if kind.startswith("#"):
        order = reversed(indices) if kind == "##" else indices
        return next((text[i:] for i in order if fnmatch.fnmatchcase(text[:i], pattern)), text)
    order = indices if kind == "%%" else reversed(indices)
    return next((text[:i] for i in order if fnmatch.fnmatchcase(text[i:], pattern)), text)


def _closing_quote(raw: str, start: int) -> int:
    i = start + 1
    while i < len(raw):
        if raw[i] == "\\":
            i += 2
            continue
        if raw[i] == "$" and i + 1 < len(raw) and raw[i + 1] in "({":
            i = _matching(raw, i + 1, raw[i + 1], ")" if raw[i + 1] == "(" else "}") + 1
            continue
        if raw[i] == '"':
            return i
        i += 1
    raise ShellError(f"unclosed double quote in {raw!r}")


def _matching(raw: str, start: int, opening: str, closing: str) -> int:
    """Index of the bracket closing raw[start] (an `opening`), skipping quoted text."""
    depth = 0
    i = start
    while i < len(raw):
        c = raw[i]
        if c == "\\":
            i += 2
            continue
        if c == "'" and closing == ")":
            i = raw.index("'", i + 1) + 1
            continue
        if c == '"':
            i = _closing_quote(raw, i) + 1
            continue
        if c == opening:
            depth += 1
        elif c == closing:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ShellError(f"unclosed {opening!r} in {raw!r}")


# --- the launch command --------------------------------------------------------------------------------------------


def _launch_of(fields: list[Word], line: int) -> Launch | None:
    """The verl run a command starts, if it does: python (or torchrun) `-m MODULE` or `FILE.py`, then Hydra overrides."""
    values = [w.value for w in fields]
    environment: dict[str, Field] = {}
    i = 0
    if "--" in values and "submit" in values[: values.index("--")]:
        i = values.index("--") + 1  # ray job submit [options] -- python3 -m ...
    while i < len(values) and (values[i] == "env" or values[i] in _WRAPPERS):
        i += 1
        while values[i - 1] == "env" and i < len(values) and (m := _ASSIGNMENT.match(str(values[i]))):
            environment[m.group(1)] = m.group(3)
            i += 1
    if i < len(values) and values[i] in _LAUNCHERS:
        i = next((j for j in range(i, len(values)) if _PYTHON.match(str(values[j]))), len(values))
    if i >= len(values) or not isinstance(values[i], str) or not _PYTHON.match(str(values[i])):
        return None
    i += 1
    entry: str | None = None
    while i < len(values):
        value = values[i]
        i += 1
        if value == "-m" and i < len(values) and isinstance(values[i], str):
            entry = str(values[i])
            i += 1
            break
        if isinstance(value, str) and value.endswith(".py") and not value.startswith("-"):
            entry = value
            break
        if value == "-c":
            return None
    args = fields[i:]
    if entry is None or not any(
        isinstance(w.value, Unknown)
        or (isinstance(w.value, str) and bool(_OVERRIDE_WORD.match(w.value) or w.value.startswith(("--config", "-c"))))
        for w in args
    ):
        return None
    return Launch(line, entry, args, environment)
