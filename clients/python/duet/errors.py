"""duet's errors as Python sees them: the frontend's Error replies (a code of duet::Errc,
core/base/error.h, mirrored by the Code enum of schemas/control.fbs) and the client's own failures
raise DuetError."""

import re

from duet.fb.Code import Code

# {9: "busy", ...}: errc_name's spelling of each Code ("OutOfRange" -> "out_of_range").
_NAMES = {
    value: re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
    for name, value in vars(Code).items() if not name.startswith("_")
}


def code_name(code: int) -> str:
    """The Errc name of a code ("busy" for 9); an unknown code is "internal"."""
    return _NAMES.get(code, "internal")


class DuetError(Exception):
    """A failure with duet's error code: `code` (int), `name` ("busy", "timeout", ...) and the
    message naming the problem."""

    def __init__(self, code: int, message: str):
        super().__init__(f"{code_name(code)}: {message}")
        self.code = code
        self.name = code_name(code)
        self.message = message
