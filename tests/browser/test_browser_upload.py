"""Upload a CSV on the Train page and train on it; a file that cannot be learned gets a one-line reason."""

import re

from playwright.sync_api import expect

import st_ui
import train_page

UPLOAD = "upload a CSV / JSONL file"
WORDS = {"good": ["great", "lovely", "works well", "excellent"], "bad": ["broken", "awful", "returned it", "poor"]}


def reviews_csv(rows: int) -> bytes:
    """A small labelled CSV, with an extra id column so the column pickers have to choose."""
    lines = ["id,text,label"]
    for i in range(rows):
        label = "good" if i % 2 == 0 else "bad"
        word = WORDS[label][i % 4]
        lines.append(f'{i},"This one is {word}, item {i}",{label}')
    return ("\n".join(lines) + "\n").encode()


def upload(page, name: str, content: bytes) -> None:
    st_ui.choose(page, "Dataset", UPLOAD)
    page.locator("[data-testid=stFileUploaderDropzoneInput]").set_input_files(
        files=[{"name": name, "mimeType": "text/csv", "buffer": content}])
    expect(page.get_by_test_id("stFileUploader")).to_contain_text(name)
    st_ui.wait_for_app(page)


def test_train_on_an_uploaded_csv(page, artifacts):
    st_ui.open_app(page)
    upload(page, "reviews.csv", reviews_csv(60))

    # The loader's guesses: the text and label columns, not the id.
    expect(page.get_by_role("combobox", name="Text column")).to_have_value("text")
    expect(page.get_by_role("combobox", name="Label column")).to_have_value("label")
    expect(st_ui.metric_value(page, "Training examples")).to_have_text("48")  # 60 rows less 20 % held out

    train_page.configure(page, micro_batch=4, grad_accum_steps=2, epochs=1)
    times = train_page.start_and_time_first_loss(page)
    expect(st_ui.metric_value(page, "Eval F1")).to_have_text(re.compile(r"^[01]\.\d{3}$"),
                                                            timeout=train_page.RUN_TIMEOUT_MS)
    train_page.wait_until_ended(page, "Completed")
    train_page.record_latency(artifacts, "uploaded csv", {**times, "run_wall_s": train_page.run_seconds(page)})
    expect(page.get_by_text("optimizer step 6 of 6")).to_be_visible()  # ceil(ceil(48/4)/2)
    st_ui.expect_no_exception(page)
    st_ui.screenshot(page, artifacts / "upload-completed.png")


def test_unlearnable_csv_gives_one_line_reason(page, artifacts):
    st_ui.open_app(page)
    upload(page, "same-label.csv", b"text,label\nfine,1\nalso fine,1\nstill fine,1\n")

    reason = page.locator("[data-testid=stAlert]").filter(has_text="same label")
    expect(reason).to_have_count(1)
    text = reason.inner_text().strip()
    assert "\n" not in text and len(text) < 200, f"not a one-line reason: {text!r}"
    expect(st_ui.button(page, "Start")).to_be_disabled()
    st_ui.expect_no_exception(page)
    st_ui.screenshot(page, artifacts / "upload-bad-file.png")
