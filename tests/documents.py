"""Small real documents made on the spot: PDF (hand-built), Word (python-docx), HTML and CSV.

``mixed_folder`` writes one of each kind ingest reads plus one it does not (``notes.xyz``), each
holding a fact found in no other file, so a test can tell which file an answer came from.
"""

from __future__ import annotations

from pathlib import Path

PDF_FACT = "The north gate access code is 4417."
DOCX_FACT = "The pool opens at 6 a.m. on weekdays."
HTML_FACT = "Parcels are left at the porter's lodge."
CSV_FACT = ("Lena Ortiz", "plumbing", "0612 345 678")
MD_FACT = "Bicycles are stored in the basement."


def pdf_bytes(pages: list[list[str]]) -> bytes:
    """A PDF whose pages hold these lines (Helvetica), with a correct cross-reference table."""
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"", b""]
    objects[2] = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"
    kids = []
    for lines in pages:
        shown = b" T* ".join(b"(" + _pdf_escaped(line) + b") Tj" for line in lines)
        content = b"BT /F1 12 Tf 14 TL 72 720 Td " + shown + b" ET"
        objects.append(b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream")
        content_ref = len(objects)
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R "
            b"/Resources << /Font << /F1 3 0 R >> >> >>" % content_ref
        )
        kids.append(b"%d 0 R" % len(objects))
    objects[1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(kids), len(kids))
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


def _pdf_escaped(text: str) -> bytes:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)").encode("latin-1")


def write_docx(path: Path, title: str, sections: list[tuple[str, list[str]]]) -> Path:
    """A Word file: a Title paragraph, then per section a Heading 1 and its paragraphs, a table."""
    import docx

    document = docx.Document()
    document.core_properties.title = title
    document.add_paragraph(title, style="Title")
    for heading, paragraphs in sections:
        document.add_heading(heading, level=1)
        for text in paragraphs:
            document.add_paragraph(text)
    table = document.add_table(rows=2, cols=2)
    for row, cells in zip(table.rows, [("Day", "Hours"), ("Saturday", "8-20")], strict=True):
        for cell, text in zip(row.cells, cells, strict=True):
            cell.text = text
    document.add_paragraph("Towels are provided.", style="List Bullet")
    document.save(path)
    return path


HTML_PAGE = f"""<!doctype html><html><head><title>Residents' guide</title>
<style>body{{color:red}}</style><script>var x=1;</script></head>
<body><nav>Home | Contact</nav>
<h1>Deliveries</h1><p>{HTML_FACT}</p><!-- an editor's comment -->
<h2>Opening hours</h2><p>The lodge is staffed <b>from 8 to 18</b>.</p>
<div hidden>draft text nobody should see</div>
<script>document.write("tracking")</script></body></html>
"""


def mixed_folder(folder: Path) -> Path:
    """One file of each kind ingest reads (.md, .pdf, .html, .docx, .csv) and a ``.xyz``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "storage.md").write_text(f"# Storage\n\n{MD_FACT}\n")
    (folder / "gate-manual.pdf").write_bytes(
        pdf_bytes([["Gate manual"], ["Access", PDF_FACT, "Change it every spring."]])
    )
    (folder / "guide.html").write_text(HTML_PAGE)
    write_docx(
        folder / "pool.docx",
        "Pool rules",
        [("Opening times", [DOCX_FACT]), ("Safety", ["Children swim with an adult."])],
    )
    name, trade, phone = CSV_FACT
    (folder / "contacts.csv").write_text(
        f'name,trade,phone\n{name},{trade},{phone}\n"Sam Lee, Jr.",electrics,0613 000 111\n'
    )
    (folder / "notes.xyz").write_bytes(b"\x00\x01 not a document")
    return folder
