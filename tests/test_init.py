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
