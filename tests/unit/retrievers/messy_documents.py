"""A real folder of documents as people have them: damaged, locked, scanned, noisy, hidden.

``messy_folder`` writes 12 files: four good ones (markdown, text, Word, CSV), a printed PDF with
a running header and footer and an ``fi`` ligature, a noisy web page (cookie banner, menu,
breadcrumbs, footer), a truncated PDF, an encrypted PDF, a scanned PDF (no text layer), a
hidden file and two files of other types.
"""

from __future__ import annotations

import io
from pathlib import Path

from tests.documents import DOCX_FACT, MD_FACT, pdf_bytes, write_docx

PRINTED_FACT = "The fire door code is 5521."
NOISY_FACT = "Parcels are kept at the porter's lodge for two weeks."
TEXT_FACT = "The bins are emptied on Tuesdays."
HEADER = "Acme Housing - Residents' handbook"

GOOD_FILES = ["contacts.csv", "handbook.pdf", "news.html", "notes.txt", "pool.docx", "storage.md"]

NOISY_PAGE = f"""<!doctype html><html><head><title>Deliveries - Acme Housing</title></head>
<body>
<div class="cookie-banner" id="cookie-consent">We use cookies to improve your experience.
Accept all cookies or manage your preferences in the settings.</div>
<header><nav><ul><li><a href="/">Home</a></li><li><a href="/guide">Residents' guide</a></li>
<li><a href="/contact">Contact</a></li><li><a href="/news">News</a></li></ul></nav></header>
<nav class="breadcrumb"><a href="/">Home</a> &gt; <a href="/guide">Guide</a> &gt; Deliveries</nav>
<main><article>
<h1>Deliveries</h1>
<p>{NOISY_FACT} The porter signs for them and returns them to the sender afterwards.</p>
<h2>Opening hours</h2>
<p>The lodge is staffed from 8 to 18 on weekdays and from 9 to 13 on Saturdays; it is closed
on Sundays and public holidays.</p>
<ul><li>Bring your resident card.</li><li>Large parcels go to the storage room.</li></ul>
</article></main>
<footer><p>&copy; 2026 Acme Housing Association &middot; Privacy policy &middot; Terms of use</p>
<p>Follow us on social media</p></footer>
</body></html>
"""


def printed_pdf() -> bytes:
    """Four pages under a running header and a page footer; page 2 says "fire" with a ligature
    (byte 0xAE is ``fi`` in the standard Type 1 encoding); page 4 holds only header and footer."""
    bodies = [
        ["Welcome", "This handbook covers the building's rules."],
        ["Safety", PRINTED_FACT.replace("fi", "\u00ae"), "Keep the corridors clear."],
        ["Waste", "Sort paper, glass and plastic."],
        [],
    ]
    pages = [
        [HEADER, *body, f"Page {number} of {len(bodies)}"] for number, body in enumerate(bodies, 1)
    ]
    return pdf_bytes(pages)


def encrypted_pdf() -> bytes:
    from pypdf import PdfWriter

    writer = PdfWriter()
    writer.add_blank_page(100, 100)
    writer.encrypt("secret", algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def messy_folder(folder: Path) -> Path:
    """The 12 files of the module docstring."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "storage.md").write_text(f"# Storage\n\n{MD_FACT}\n")
    (folder / "notes.txt").write_text(f"{TEXT_FACT}\n")
    write_docx(folder / "pool.docx", "Pool rules", [("Opening times", [DOCX_FACT])])
    (folder / "contacts.csv").write_text("name,trade\nLena Ortiz,plumbing\n")
    (folder / "handbook.pdf").write_bytes(printed_pdf())
    (folder / "news.html").write_text(NOISY_PAGE)
    (folder / "cut.pdf").write_bytes(pdf_bytes([["whole"]])[:60])
    (folder / "locked.pdf").write_bytes(encrypted_pdf())
    (folder / "scan.pdf").write_bytes(pdf_bytes([[], []]))
    (folder / ".hidden.md").write_text("A draft nobody should search.\n")
    (folder / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (folder / "notes.xyz").write_bytes(b"\x00\x01 not a document")
    return folder
