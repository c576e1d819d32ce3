"""Render stage: Jinja templates in `reports/` turn an Analysis into Markdown, HTML, PR comments, digests."""

from .report import render_html, render_markdown, render_text, write_outputs

__all__ = ["render_html", "render_markdown", "render_text", "write_outputs"]
