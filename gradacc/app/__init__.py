"""The Streamlit glue the pages share: widgets, the Train form, run views, charts, code view."""
