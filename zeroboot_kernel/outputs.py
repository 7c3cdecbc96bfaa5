"""What the kernel lets a cell's rich output do in the user's browser (%sandbox outputs).

JupyterLab renders output produced in the current session as trusted: HTML with its scripts,
application/javascript, Markdown with raw HTML. For untrusted cell code (students, generated
code) that is script execution in the user's browser session, with the user's Jupyter token.

    trusted  outputs go to the frontend as the cell made them (as under ipykernel)
    safe     script is removed before anything reaches the frontend:
               - application/javascript (and every other JavaScript/ECMAScript type) is dropped
               - text/html is sanitised by nh3 (the Ammonia sanitiser): no script, style or
                 iframe elements, no event handler attributes, no javascript: URLs
               - text/markdown is rendered to HTML (mistune) and sanitised the same way
                 (Markdown may hold raw HTML and javascript: links)
               - image/svg+xml is dropped (SVG can hold script and event handlers)
             The rest (text/plain, images, LaTeX, JSON) is unchanged.

ZEROBOOT_OUTPUTS sets the policy at start (the isolated kernelspec defaults to safe).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable

POLICIES = ("trusted", "safe")
SCRIPT_TYPES = ("javascript", "ecmascript")
DROPPED_IN_SAFE = ("image/svg+xml",)
# HTML attributes kept in safe mode beyond Ammonia's defaults: layout of tables (pandas), classes
EXTRA_ATTRIBUTES = {"*": {"class"}, "table": {"border"}, "th": {"colspan", "rowspan"},
                    "td": {"colspan", "rowspan"}}
URL_SCHEMES = {"http", "https", "mailto", "data"}


@lru_cache(maxsize=1)
def _sanitiser() -> Callable[[str], str]:
    import nh3

    attributes = {tag: set(attrs) for tag, attrs in nh3.ALLOWED_ATTRIBUTES.items()}
    for tag, extra in EXTRA_ATTRIBUTES.items():
        attributes[tag] = attributes.get(tag, set()) | extra
    return lambda html: nh3.clean(html, attributes=attributes, url_schemes=URL_SCHEMES,
                                  link_rel="noopener noreferrer nofollow")


def sanitise_html(html: str) -> str:
    return _sanitiser()(html)


@lru_cache(maxsize=1)
def _markdown() -> Callable[[str], str]:
    import mistune

    render = mistune.create_markdown(escape=False, plugins=["strikethrough", "table", "url"])
    return lambda text: str(render(text))


def markdown_to_safe_html(text: str) -> str:
    return sanitise_html(_markdown()(text))


def filter_bundle(data: dict[str, Any], policy: str) -> dict[str, Any]:
    """A display data bundle as the policy allows it to reach the frontend."""
    if policy == "trusted":
        return data
    out: dict[str, Any] = {}
    for mime, value in data.items():
        low = mime.lower()
        if any(s in low for s in SCRIPT_TYPES) or low in DROPPED_IN_SAFE:
            continue
        if low == "text/html":
            out[mime] = sanitise_html(value if isinstance(value, str) else str(value))
        elif low == "text/markdown":
            if not any(m.lower() == "text/html" for m in data):  # else the bundle's own HTML shows
                out["text/html"] = markdown_to_safe_html(value if isinstance(value, str) else str(value))
        else:
            out[mime] = value
    return out


def filter_content(content: dict[str, Any], policy: str) -> dict[str, Any]:
    """A display_data / update_display_data / execute_result content under the policy."""
    if policy == "trusted" or not isinstance(content.get("data"), dict):
        return content
    return {**content, "data": filter_bundle(content["data"], policy)}
