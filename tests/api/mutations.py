"""Generated mutations of valid RLJobs, for the offline-equals-server test.

Each mutation changes one thing a user gets wrong: a snake_case name, an unknown key, a number written as a
string, a value off the end of its range, a boolean written as a number, a batch size that breaks a rule. The
offline validator and the apiserver must give each the same verdict (valid or not).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kuberl.api import yaml12
from tests.api.cases import BASE

ROOT = Path(__file__).resolve().parents[2]


def example_documents() -> list[tuple[str, dict[str, Any]]]:
    """Every RLJob in examples/, named `file#n`."""
    docs = []
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for i, doc in enumerate(d for d in yaml12.load_all(path.read_text()) if d):
            if doc.get("kind") == "RLJob":
                docs.append((f"{path.name}#{i + 1}", doc))
    return docs


def _leaves(node: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[tuple[str | int, ...], Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _leaves(value, (*path, i))
    else:
        yield path, node


def _objects(node: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    if isinstance(node, dict):
        yield path
        for key, value in node.items():
            yield from _objects(value, (*path, key))


def _edited(doc: dict[str, Any], path: tuple[str | int, ...], edit: Any) -> dict[str, Any]:
    result = copy.deepcopy(doc)
    node: Any = result
    for key in path[:-1]:
        node = node[key]
    edit(node, path[-1])
    return result


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name).replace("g_p_u", "gpu")


def mutations(name: str, doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(id, document) for every mutation of `doc`'s spec."""
    spec_path: tuple[str | int, ...] = ("spec",)
    for path in _objects(doc["spec"], spec_path):
        node: Any = doc
        for key in path:
            node = node[key]
        for key in list(node):
            if isinstance(key, str) and _snake(key) != key:
                snake = _snake(key)

                def rename(parent: dict[str, Any], k: str | int, old: str = key, new: str = snake) -> None:
                    parent[k][new] = parent[k].pop(old)

                yield f"{name}:snake:{'.'.join(map(str, path))}.{snake}", _edited(doc, path, rename)
        yield f"{name}:unknown:{'.'.join(map(str, path))}", _edited(doc, path, _add_unknown)
    for path, value in _leaves(doc["spec"], spec_path):
        where = ".".join(map(str, path))
        if isinstance(value, bool):
            yield f"{name}:bool-as-int:{where}", _edited(doc, path, _set(int(value)))
            yield f"{name}:bool-as-string:{where}", _edited(doc, path, _set(str(value).lower()))
        elif isinstance(value, int):
            yield f"{name}:int-as-string:{where}", _edited(doc, path, _set(str(value)))
            yield f"{name}:int-zero:{where}", _edited(doc, path, _set(0))
            yield f"{name}:int-minus-one:{where}", _edited(doc, path, _set(-1))
            yield f"{name}:int-plus-one:{where}", _edited(doc, path, _set(value + 1))
            yield f"{name}:int-huge:{where}", _edited(doc, path, _set(2**31))
            yield f"{name}:int-as-fraction:{where}", _edited(doc, path, _set(value + 0.5))
        elif isinstance(value, float):
            yield f"{name}:float-negative:{where}", _edited(doc, path, _set(-value - 1))
            yield f"{name}:float-as-string:{where}", _edited(doc, path, _set(str(value)))
        elif isinstance(value, str):
            yield f"{name}:string-empty:{where}", _edited(doc, path, _set(""))
            yield f"{name}:string-as-int:{where}", _edited(doc, path, _set(7))


def _add_unknown(parent: dict[str, Any], key: str | int) -> None:
    parent[key]["notAField"] = 1


def _set(value: Any) -> Any:
    def edit(parent: Any, key: Any) -> None:
        parent[key] = value

    return edit


def all_documents() -> list[tuple[str, dict[str, Any]]]:
    """The examples, BASE, and every mutation of BASE and of the examples."""
    sources = [("base", BASE), *example_documents()]
    result = list(sources)
    for name, doc in sources:
        result += list(mutations(name, doc))
    return result
