"""Claude Code's tool descriptions, as its models were trained on them (with
toolpool's notes where toolpool differs: the workspace, the sandbox, the spill
file): data for ``claude_code.py``'s adapters.
"""

READ_DESCRIPTION = """\
Reads a file from the local filesystem. You can access any file in the workspace \
directly with this tool; if the user gives a path to a file, assume it is valid: \
reading a file that does not exist returns an error.

Usage:
- The file_path parameter is the absolute path of the file (a path relative to the \
workspace works too)
- By default, it reads up to 2000 lines starting from the beginning of the file
- You can optionally specify a line offset and limit (especially handy for long \
files), but it is recommended to read the whole file by not providing these parameters
- Any lines longer than 2000 characters will be truncated
- Results are returned using cat -n format, with line numbers starting at 1
- This tool can read images (PNG, JPG, GIF, WebP): their contents are presented visually
- This tool can read PDF files (.pdf) page by page; use pages ("3" or "1-5") for \
large ones, at most 20 pages per request
- This tool can read Jupyter notebooks (.ipynb files) and returns all cells with \
their outputs
- This tool reads files, not directories: to list a directory, use Glob or ls via Bash
- You can call multiple tools in a single response: read several files at once when \
they may all be useful
- Edit and Write refuse a file that was not read whole in this session"""

WRITE_DESCRIPTION = """\
Writes a file to the local filesystem.

Usage:
- This tool will overwrite the existing file if there is one at the provided path.
- If this is an existing file, you MUST use the Read tool first to read the file's \
contents. This tool will fail if you did not read the file first.
- ALWAYS prefer editing existing files in the codebase. NEVER write new files unless \
explicitly required.
- NEVER proactively create documentation files (*.md) or README files. Only create \
documentation files if explicitly requested by the user."""

EDIT_DESCRIPTION = """\
Performs exact string replacements in files.

Usage:
- You must use your Read tool at least once in the conversation before editing. This \
tool will error if you attempt an edit without reading the file.
- When editing text from Read tool output, preserve the exact indentation (tabs and \
spaces) as it appears AFTER the line number prefix. The prefix is: spaces, the line \
number, a tab. Everything after that tab is the actual file content to match. Never \
include any part of the line number prefix in old_string or new_string.
- ALWAYS prefer editing existing files in the codebase. NEVER write new files unless \
explicitly required.
- The edit will FAIL if old_string is not unique in the file. Either provide a larger \
string with more surrounding context to make it unique or use replace_all to change \
every instance of old_string.
- Use replace_all for replacing and renaming strings across the file, for instance \
to rename a variable."""

MULTI_EDIT_DESCRIPTION = """\
Makes multiple edits to a single file in one operation. Prefer it to the Edit tool \
for several edits to the same file.

Before using this tool, use the Read tool to understand the file's contents.

- file_path: the absolute path of the file to modify
- edits: the edit operations, each with old_string (the text to replace, exactly as \
in the file, whitespace included), new_string (the text to put in its place) and \
replace_all (replace every occurrence; default false)

IMPORTANT:
- All edits are applied in sequence, in the order they are provided
- Each edit operates on the result of the previous edit
- All edits must be valid for the operation to succeed: if any edit fails, none will \
be applied
- Plan the edits so that an earlier one does not change the text a later one looks for"""

GLOB_DESCRIPTION = """\
- Fast file pattern matching tool that works with any codebase size
- Supports glob patterns like "**/*.js" or "src/**/*.ts"
- Returns matching file paths sorted by modification time, newest first
- Use this tool when you need to find files by name patterns
- You can call multiple tools in a single response: run several searches at once \
when they may be useful"""

GREP_DESCRIPTION = """\
A powerful search tool built on ripgrep.

Usage:
- ALWAYS use Grep for search tasks. NEVER invoke grep or rg as a Bash command.
- Supports full regex syntax (e.g. "log.*Error", "function\\s+\\w+")
- Filter files with the glob parameter (e.g. "*.js", "**/*.tsx") or the type \
parameter (e.g. "js", "py", "rust")
- Output modes: "content" shows matching lines, "files_with_matches" shows only file \
paths (default), "count" shows match counts
- Pattern syntax: ripgrep's, not grep's: literal braces need escaping (use \
interface\\{\\} to find interface{} in Go code)
- Multiline matching: by default patterns match within single lines only; for \
patterns that span lines use multiline: true"""

BASH_DESCRIPTION = """\
Executes a given bash command with an optional timeout, in the workspace, confined.

IMPORTANT: This tool is for terminal operations like git, npm, docker, running tests. \
DO NOT use it for file operations (reading, writing, editing, searching, finding \
files): use the specialized tools for this instead.

Usage notes:
- The command argument is required.
- You can specify an optional timeout in milliseconds (up to 600000ms / 10 minutes). \
If not specified, commands time out after 120000ms (2 minutes).
- Write a clear, concise description of what the command does in 5-10 words.
- If the output exceeds 30000 characters, it is cut in the middle; the full output \
is saved to a file the result names.
- The working directory persists between commands (a command that ends outside \
the workspace sends the next one back, and says so); shell state (variables, \
functions) does not, unless the session's shell is persistent.
- stdin is empty: interactive commands cannot work.{background}"""

BASH_BACKGROUND = """
- You can use the run_in_background parameter to run the command in the background, \
which lets you keep working while it runs. Read its output with BashOutput, stop it \
with KillShell. Do not use '&' at the end of the command when using this parameter."""

BASH_OUTPUT_DESCRIPTION = """\
- Retrieves output from a running or completed background bash shell
- Takes a bash_id parameter identifying the shell
- Always returns only new output since the last check
- Returns the output along with the shell's status
- Supports optional regex filtering to show only lines matching a pattern
- Use this tool when you need to monitor or check the output of a long-running shell"""

KILL_SHELL_DESCRIPTION = """\
- Kills a running background bash shell by its ID
- Takes a shell_id parameter identifying the shell to kill
- Returns a success or failure status
- Use this tool when you need to terminate a long-running shell"""

NOTEBOOK_EDIT_DESCRIPTION = """\
Completely replaces the contents of a specific cell in a Jupyter notebook (.ipynb \
file) with new source. The notebook_path parameter must be an absolute path (or one \
relative to the workspace). cell_id is the id of the cell to edit, as Read shows it. \
Use edit_mode=insert to add a new cell after the cell cell_id (at the top without \
one), and edit_mode=delete to delete the cell. Read the notebook first."""
