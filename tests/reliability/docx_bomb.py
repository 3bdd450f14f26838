"""A Word file that is small on the wire and slow to parse: hundreds of thousands of empty
paragraphs (the one reported was 83 KB, 16 MiB unpacked, 493K paragraphs, ~37 min of CPU)."""

from __future__ import annotations

import io
import zipfile

NUM_PARAGRAPHS = 493_000
_PARAGRAPH = b"<w:p><w:r><w:t></w:t></w:r></w:p>"


def docx_bomb(num_paragraphs: int = NUM_PARAGRAPHS) -> bytes:
    """A valid .docx (python-docx's blank document) whose body is ``num_paragraphs`` empty
    paragraphs."""
    import docx

    blank = io.BytesIO()
    docx.Document().save(blank)
    out = io.BytesIO()
    with (
        zipfile.ZipFile(blank) as source,
        zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as bomb,
    ):
        for item in source.infolist():
            data = source.read(item.filename)
            if item.filename == "word/document.xml":
                start = data.index(b"<w:body>") + len(b"<w:body>")
                end = data.index(b"<w:sectPr")
                data = data[:start] + _PARAGRAPH * num_paragraphs + data[end:]
            bomb.writestr(item.filename, data)
    return out.getvalue()
