"""PDF, Word, HTML and CSV files read into documents: text without markup, headings, rows."""

from __future__ import annotations

import io
import zipfile

import pytest

pytest.importorskip("pypdf")
pytest.importorskip("docx")
pytest.importorskip("bs4")

from adarag.errors import InputError  # noqa: E402
from adarag.retrievers.chunking import read_source_file  # noqa: E402
from adarag.retrievers.splitting import markdown_sections  # noqa: E402
from tests.documents import HTML_FACT, HTML_PAGE, pdf_bytes, write_docx  # noqa: E402


def test_a_pdf_is_one_document_per_page_with_text(tmp_path):
    path = tmp_path / "manual.pdf"
    path.write_bytes(pdf_bytes([["Intro (draft)"], [], ["Access", "Code 4417 \\ backup"]]))
    source = read_source_file(path)
    assert [(d.key, d.metadata, d.text) for d in source.documents] == [
        ("page 1", {"page": 1}, "Intro (draft)"),  # the blank page 2 gives no document
        ("page 3", {"page": 3}, "Access\nCode 4417 \\ backup"),
    ]
    assert not source.has_headings


def test_a_damaged_or_locked_pdf_is_refused_by_name(tmp_path):
    from pypdf import PdfWriter

    damaged = tmp_path / "cut.pdf"
    damaged.write_bytes(pdf_bytes([["whole"]])[:60])
    with pytest.raises(InputError, match=r"cut\.pdf cannot be read as a PDF"):
        read_source_file(damaged)
    writer = PdfWriter()
    writer.add_blank_page(100, 100)
    writer.encrypt("secret", algorithm="RC4-128")
    locked = io.BytesIO()
    writer.write(locked)
    (tmp_path / "locked.pdf").write_bytes(locked.getvalue())
    with pytest.raises(InputError, match=r"locked\.pdf is an encrypted PDF"):
        read_source_file(tmp_path / "locked.pdf")


def test_a_word_file_keeps_its_headings_lists_and_tables(tmp_path):
    path = write_docx(
        tmp_path / "pool.docx",
        "Pool rules",
        [("Opening times", ["Open at 6.", "Closed on Mondays."]), ("Safety", ["Swim with care."])],
    )
    source = read_source_file(path)
    assert source.has_headings
    (document,) = source.documents
    assert document.title == "Pool rules"
    assert document.text.splitlines() == [
        "# Opening times",
        "Open at 6.",
        "Closed on Mondays.",
        "# Safety",
        "Swim with care.",
        "Day | Hours",
        "Saturday | 8-20",
        "- Towels are provided.",
    ]
    assert [s.heading for s in markdown_sections(document.text)] == ["Opening times", "Safety"]


def test_a_word_file_that_unpacks_past_the_byte_limit_is_refused(tmp_path):
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("word/document.xml", b"\x00" * 2_000_000)
    path = tmp_path / "bomb.docx"
    path.write_bytes(bomb.getvalue())
    assert path.stat().st_size < 10_000
    with pytest.raises(InputError, match=r"bomb\.docx unpacks to 2000\d+ bytes"):
        read_source_file(path, max_file_bytes=1_000_000)
    with pytest.raises(InputError, match=r"bomb\.docx cannot be read as a Word"):
        read_source_file(path)  # within the limit, but not a Word document


def test_html_is_text_without_markup_scripts_styles_comments_or_hidden_parts(tmp_path):
    path = tmp_path / "guide.html"
    path.write_text(HTML_PAGE)
    source = read_source_file(path)
    assert source.has_headings
    (document,) = source.documents
    assert document.title == "Residents' guide"
    assert HTML_FACT in document.text and "from 8 to 18" in document.text
    for leaked in ("<", "color:red", "var x", "tracking", "editor's comment", "draft text"):
        assert leaked not in document.text, leaked
    sections = markdown_sections(document.text)
    assert [s.heading for s in sections] == [None, "Deliveries", "Deliveries > Opening hours"]


def test_html_in_a_declared_charset_is_decoded_and_nul_is_refused(tmp_path):
    latin = tmp_path / "latin.htm"
    page = '<html><head><meta charset="iso-8859-1"></head><body><p>café crème</p></body></html>'
    latin.write_bytes(page.encode("latin-1"))
    assert read_source_file(latin).documents[0].text == "café crème"
    binary = tmp_path / "nul.html"
    binary.write_bytes(b"<p>a\x00b</p>")
    with pytest.raises(InputError, match="looks binary"):
        read_source_file(binary)


def test_csv_is_one_record_per_row_with_its_header(tmp_path):
    path = tmp_path / "contacts.csv"
    path.write_text('name;trade;phone\nLena;plumbing;0612\n"Lee; Jr.";;0613;extra\n;;\n')
    source = read_source_file(path)
    assert [(d.key, d.metadata, d.text) for d in source.documents] == [
        ("row 1", {"row": 1}, "name: Lena\ntrade: plumbing\nphone: 0612"),
        ("row 2", {"row": 2}, "name: Lee; Jr.\nphone: 0613\ncolumn 4: extra"),
    ]  # the empty row gives none; the empty cell is left out


def test_a_csv_field_over_the_parser_limit_is_refused_with_its_line(tmp_path):
    path = tmp_path / "huge.csv"
    path.write_text('a,b\n1,"' + "x" * 200_000 + '"\n')
    with pytest.raises(InputError, match=r"huge\.csv:\d+: not readable as CSV"):
        read_source_file(path)


def test_a_printed_pdf_loses_its_running_header_footer_and_ligatures(tmp_path):
    from tests.unit.retrievers.messy_documents import HEADER, PRINTED_FACT, printed_pdf

    path = tmp_path / "handbook.pdf"
    path.write_bytes(printed_pdf())
    pages = {d.metadata["page"]: d.text for d in read_source_file(path).documents}
    assert sorted(pages) == [1, 2, 3]  # page 4 held only the header and the footer
    assert pages[2] == f"Safety\n{PRINTED_FACT}\nKeep the corridors clear."
    for text in pages.values():
        assert HEADER not in text and "Page" not in text and "\ufb01" not in text


def test_a_two_page_pdf_keeps_lines_it_repeats(tmp_path):
    path = tmp_path / "memo.pdf"
    path.write_bytes(pdf_bytes([["Memo", "Lift out of order."], ["Memo", "Fixed on Monday."]]))
    assert [d.text for d in read_source_file(path).documents] == [
        "Memo\nLift out of order.",
        "Memo\nFixed on Monday.",
    ]


def test_a_noisy_page_keeps_its_main_content_without_menu_banner_or_footer(tmp_path):
    pytest.importorskip("trafilatura")
    from tests.unit.retrievers.messy_documents import NOISY_FACT, NOISY_PAGE

    path = tmp_path / "news.html"
    path.write_text(NOISY_PAGE)
    (document,) = read_source_file(path).documents
    assert document.title == "Deliveries - Acme Housing"
    lines = document.text.splitlines()
    assert lines[:3] == [
        "# Deliveries",
        f"{NOISY_FACT} The porter signs for them and returns them to the sender afterwards.",
        "",
    ]
    assert lines[3] == "## Opening hours" and lines[-1] == "- Large parcels go to the storage room."
    for noise in ("cookies", "Home", "Contact", "Guide", "Privacy", "social media", "2026"):
        assert noise not in document.text, noise


def test_a_page_without_main_content_is_kept_whole(tmp_path):
    pytest.importorskip("trafilatura")
    path = tmp_path / "table.html"
    path.write_text("<html><body><table><tr><th>Day</th><td>Hours</td></tr></table></body></html>")
    assert [d.text for d in read_source_file(path).documents] == ["Day | Hours"]
