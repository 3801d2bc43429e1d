"""The code as notebook.ipynb shows it: listings of the scripts, read as they are on disk now.

A line whose comment opens with `# +` goes beyond the article (the scripts'
docstrings say so). `marked_lines` is the one reader of that marker: the
notebook greys those lines and folds long runs of them, tests/test_listing.py
skips them to compare what is left with the article's listing.
"""
import ast
import html
import io
import os
import pathlib
import re
import tokenize

from pyimagesearch.notebook import NotebookStop, ipython_display, show_markdown
from pyimagesearch.runtime import SCRIPTS

MARK = re.compile(r"# \+(\s|$)")  # at the start of a comment: "# +", "# + the reason"
FOLD_FROM = 4  # so many marked lines in a row are folded into one line that opens them
DIMMED = "color:#9e9e9e"
COMMENT = "color:#2e7d32"  # the article's comments, and the reasons of its departures


def marked_lines(source):
    """The numbers of the lines of `source` whose comment opens with `# +`.

    Read with tokenize, so a "# +" inside a string or a docstring marks nothing.
    """
    return {token.start[0] for token in tokenize.generate_tokens(io.StringIO(source).readline)
            if token.type == tokenize.COMMENT and MARK.match(token.string)}


def script_lines(path, name=None):
    """[(number, line)] of the file at `path` as it is now: all, or definition `name`'s.

    Read when called, so the notebook shows what the script holds when it
    runs, never a copy. `name` is a top-level function or class (with its
    decorators), found with `ast`.
    """
    text = pathlib.Path(path).read_text()
    lines = text.splitlines()
    if name is None:
        return list(enumerate(lines, start=1))
    for node in ast.parse(text).body:
        if getattr(node, "name", None) == name:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            return [(n, lines[n - 1]) for n in range(first, node.end_lineno + 1)]
    raise NotebookStop(f"{path} defines no {name}; is the repository whole?")


def _html_line(number, line, dimmed):
    """One line of a listing, numbered; its comment green, or all of it grey where marked."""
    if dimmed:
        body = f'<span style="{DIMMED}">{html.escape(line)}</span>'
    else:
        code, comment = _split_comment(line)
        body = html.escape(code) + (f'<span style="{COMMENT}">{html.escape(comment)}</span>'
                                    if comment else "")
    return f'<span style="{DIMMED}">{number:4d}</span>  {body}'


def _split_comment(line):
    """(code, comment) of one line of Python; the comment found by tokenize, not by '#'."""
    try:
        for token in tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline):
            if token.type == tokenize.COMMENT:
                at = line.index(token.string)
                return line[:at], line[at:]
    except (tokenize.TokenError, IndentationError, SyntaxError, ValueError):
        pass  # a line of a longer statement or string: '#' is a comment if it starts one
    stripped = line.lstrip()
    return (line, "") if not stripped.startswith("#") else (line[:len(line) - len(stripped)],
                                                            stripped)


def listing_html(numbered, title, marked=frozenset()):
    """The lines as HTML: those whose numbers are in `marked` grey, long runs of them folded."""
    pre = '<pre style="margin:0;line-height:1.35;font-size:90%">'
    parts = [f"<p><b>{html.escape(title)}</b> "
             f'<span style="{DIMMED}">(grey: the lines marked <code># +</code>, beyond the '
             "article; click a folded group to open it)</span></p>", pre]
    index = 0
    while index < len(numbered):
        end = index
        while end < len(numbered) and numbered[end][0] in marked:
            end += 1
        group = numbered[index:end]
        if len(group) >= FOLD_FROM:
            parts.append("</pre><details><summary style=\"" + DIMMED + "\">"
                         f"lines {group[0][0]}-{group[-1][0]}: {len(group)} lines marked # +"
                         f"</summary>{pre}"
                         + "\n".join(_html_line(n, line, True) for n, line in group)
                         + "</pre></details>" + pre)
            index = end
        elif group:
            parts.append("\n".join(_html_line(n, line, True) for n, line in group) + "\n")
            index = end
        else:
            number, line = numbered[index]
            parts.append(_html_line(number, line, False) + "\n")
            index += 1
    parts.append("</pre>")
    return "".join(parts).replace(pre + "</pre>", "")


def _display_listing(numbered, title, marked=frozenset()):
    """Show `numbered` as HTML, and as numbered plain text where HTML is not shown."""
    shown = {"text/html": listing_html(numbered, title, marked),
             "text/plain": "\n".join(f"{n:4d}  {line}" for n, line in numbered)}
    ipython_display().display(shown, raw=True)


def show_listing(path, repo=".", name=None):
    """Show the lines of `path` (a script, or definition `name` in it) as they are on disk now."""
    full = os.path.join(repo, path)
    numbered = script_lines(full, name)
    title = f"{path}" + (f": {name}" if name else "") + f", as it is now ({len(numbered)} lines)"
    _display_listing(numbered, title, marked_lines(pathlib.Path(full).read_text()))


def _code_lines(path):
    """{code: (number, line)} of the unmarked code lines of a script, comments dropped."""
    text = pathlib.Path(path).read_text()
    skip = marked_lines(text)
    for node in ast.walk(ast.parse(text)):  # docstrings are prose, not code
        if isinstance(node, ast.Expr) and isinstance(getattr(node, "value", None),
                                                     ast.Constant) \
                and isinstance(node.value.value, str):
            skip.update(range(node.lineno, node.end_lineno + 1))
    found = {}
    for number, line in enumerate(text.splitlines(), start=1):
        code = _split_comment(line)[0].strip()
        if code and number not in skip:
            found.setdefault(code, (number, line))
    return found


def show_differences(scripts=SCRIPTS, repo="."):
    """Each script's unmarked code lines that the other scripts do not have: the strategy."""
    codes = {script: _code_lines(os.path.join(repo, script)) for script in scripts}
    for script, lines in codes.items():
        others = set().union(*(set(codes[other]) for other in scripts if other != script))
        own = sorted(lines[code] for code in set(lines) - others)
        _display_listing(own, f"{script}: its {len(own)} lines of code that the other "
                              "scripts lack")


def project_structure(repo="."):
    """The article's files, then what the repository adds, each with its docstring's first line."""
    root = pathlib.Path(repo)
    article = [*SCRIPTS, "pyimagesearch/autoencoder.py", "pyimagesearch/config.py",
               "pyimagesearch/data.py", "pyimagesearch/loss.py"]
    added = sorted({str(path.relative_to(root)) for pattern in ("*.py", "pyimagesearch/*.py",
                                                                "tools/*.py")
                    for path in root.glob(pattern)} - set(article)
                   - {"pyimagesearch/__init__.py"})
    rows = ["| file | what it holds (its docstring's first line) |", "| --- | --- |"]
    rows += [f"| `{name}` | {_first_line(root / name)} |" for name in article]
    rows.append("| *beyond the article* | |")
    rows += [f"| `{name}` | {_first_line(root / name)} |" for name in added]
    folders = sorted(path.name + "/" for path in (root / "pyimagesearch").iterdir()
                     if (path / "__init__.py").is_file())
    rows.append(f"| `pyimagesearch/{{{','.join(folders)}}}` | "
                "the data sources, training machinery and platforms the scripts call |")
    show_markdown("\n".join(rows))


def _first_line(path):
    """The first line of a Python file's docstring, Markdown-safe; '' if it has none."""
    try:
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    except (OSError, SyntaxError):
        return ""
    return doc.strip().splitlines()[0].replace("|", "\\|") if doc.strip() else ""
