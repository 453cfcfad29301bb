"""A finished run's "Download for TensorBoard", clicked in a real browser: a zip TensorBoard reads back."""

import io
import zipfile

import train_page
import st_ui


def test_a_finished_run_downloads_its_tensorboard_files(page, artifacts, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    st_ui.open_app(page)
    train_page.configure(page, micro_batch=8, grad_accum_steps=2, epochs=1, train_samples=64, eval_samples=32)
    run_id = train_page.start(page)
    train_page.wait_until_ended(page, "Completed")

    # The zip is built on the server when the button is clicked (Streamlit's deferred download).
    with page.expect_download() as download:
        train_page.status_panel(page).get_by_role("button", name="Download for TensorBoard").click()
    assert download.value.suggested_filename == f"gradacc-{run_id}-tensorboard.zip"
    with zipfile.ZipFile(io.BytesIO(download.value.path().read_bytes())) as archive:
        names = archive.namelist()
        assert len(names) == 1 and names[0].startswith(f"{run_id}/events.out.tfevents."), names
        archive.extractall(tmp_path)
    accumulator = EventAccumulator(str(tmp_path / run_id))
    accumulator.Reload()
    assert [s.step for s in accumulator.Scalars("train/loss")] == [1, 2, 3, 4]  # ceil(ceil(64/8)/2)
    assert [s.step for s in accumulator.Scalars("eval/f1")] == [4]
    st_ui.expect_no_exception(page)
