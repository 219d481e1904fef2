"""No import circle in celery_singlebeat, module by module.

import-linter's ``acyclic_siblings`` contract (pyproject.toml, run by ``make
lint``) looks for circles between the children of each package, each child
with everything beneath it squashed into one node. That misses a circle
between a package's ``__init__`` and its own children (``cli/__init__.py``
imported its command modules, which imported the group back from it), so
this test builds the same import graph (grimp, which import-linter ships) and
looks for circles between modules: every import counts, at module level, in
a function or under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import pytest

import celery_singlebeat

# import-linter (and its grimp) is in the dev extra from Python 3.11 on; the
# import graph is the same under every interpreter, checked under the newest
grimp = pytest.importorskip("grimp")

PACKAGE = "celery_singlebeat"


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports directly."""
    # no cache: it would write .grimp_cache into the checkout
    graph = grimp.build_graph(PACKAGE, cache_dir=None)
    return {
        module: {m for m in graph.find_modules_directly_imported_by(module) if m in graph.modules}
        for module in graph.modules
    }


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (and the
    modules that import themselves), each sorted: Tarjan's algorithm, without
    recursion so that a long chain cannot reach Python's recursion limit."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges[node]:
                    found.append(sorted(component))
    return sorted(found)


def test_the_graph_is_the_installed_package() -> None:
    # grimp finds the package on sys.path: the one these tests import
    edges = import_graph()
    assert f"{PACKAGE}.scheduler" in edges and f"{PACKAGE}.store.sql" in edges
    assert celery_singlebeat.__file__ is not None


def test_there_is_no_import_circle() -> None:
    edges = import_graph()
    found = circles(edges)
    described = [
        " -> ".join(component)
        + "; imports inside: "
        + ", ".join(f"{a} -> {b}" for a in component for b in sorted(edges[a]) if b in component)
        for component in found
    ]
    assert not found, "import circles:\n" + "\n".join(described)


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"a"}, "c": {"a"}}, [["a", "b"]]),
        ({"a": {"a"}}, [["a"]]),
        (
            {"p": {"p.x"}, "p.x": {"p.y"}, "p.y": {"p"}, "q": {"r"}, "r": {"q"}},
            [["p", "p.x", "p.y"], ["q", "r"]],
        ),
    ],
)
def test_circles_are_found(edges: dict[str, set[str]], expected: list[list[str]]) -> None:
    # the check itself can fail: a circle through a package's __init__ included
    assert circles(edges) == expected
