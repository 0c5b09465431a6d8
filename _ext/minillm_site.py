"""Sphinx fixes for the book's site (loaded from _config.yml as a local extension).

Inline scripts an extension adds with ``app.add_js_file(None, body=...)`` after the HTML builder is
initialised (sphinx-thebe does so on ``env-before-read-docs``) are stored on the builder with filename
``None``; Sphinx 7.4's ``prepare_writing`` adds them again from the registry as ``''``, and the two do
not compare equal, so every page carried each inline script twice. For sphinx-thebe's
``const THEBE_JS_URL = ...`` that is a SyntaxError in the browser ("Identifier 'THEBE_JS_URL' has
already been declared"). Normalising the filename before writing lets Sphinx's own de-duplication work.
"""
from __future__ import annotations


def _normalise_inline_scripts(app, env) -> None:
    builder = app.builder
    scripts = getattr(builder, "_js_files", None)
    if scripts is None:
        return
    from sphinx.builders.html._assets import _JavaScript

    unique: list = []
    for js in scripts:
        if js.filename is None:
            js = _JavaScript("", priority=js.priority, **js.attributes)
        if js not in unique:
            unique.append(js)
    scripts[:] = unique


def setup(app):
    app.connect("env-updated", _normalise_inline_scripts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
