import subprocess
import sys
import textwrap


def test_import_minillm_needs_only_numpy():
    """`import minillm` and the NumPy references must work with torch and triton unavailable."""
    code = textwrap.dedent("""
        import sys
        sys.modules["torch"] = None     # any `import torch` now raises ImportError
        sys.modules["triton"] = None
        import minillm
        m = minillm.load_model("tiny")
        out = minillm.cached_decode(m, [65, 66], 3)
        assert len(out.new_tokens) == 3
        assert not any(k.startswith(("torch", "triton")) and sys.modules[k] is not None for k in sys.modules)
        print("ok")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def _package_import_graph():
    """Edges module -> module for every relative import in the package (module-level and deferred alike)."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent / "minillm"
    graph = {}
    for path in root.rglob("*.py"):
        mod = ".".join(("minillm",) + path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = pkg.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
                edges.add(target)
        graph[mod] = edges
    return graph


def test_package_has_no_import_cycles():
    graph = _package_import_graph()
    assert "minillm.decode" in graph and "minillm.kvcache" in graph
    state = {}

    def visit(m, stack):
        state[m] = "open"
        for n in graph.get(m, ()):
            if n not in graph or n == m:
                continue
            if state.get(n) == "open":
                raise AssertionError(" -> ".join(stack + [m, n]))
            if n not in state:
                visit(n, stack + [m])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [])


def test_kvcache_imports_nothing_from_the_package():
    assert _package_import_graph()["minillm.kvcache"] == set()


def test_package_imports_no_private_name_across_modules():
    """A module's underscored names are its own: no other module imports them (issue 33). A private *module*
    (``explorables/_base.py``) may serve the modules of its own folder."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent / "minillm"
    found = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.module == "__future__":
                continue
            if not (node.level or (node.module or "").startswith("minillm")):
                continue
            found += [f"{path.relative_to(root)}: {a.name} from {node.module}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
    assert not found, found


def test_no_module_over_700_lines():
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent / "minillm"
    long = {str(p.relative_to(root)): n for p in root.rglob("*.py") if (n := len(p.read_text().splitlines())) > 700}
    assert not long, long
