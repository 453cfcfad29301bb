"""The Streamlit glue the pages share: the server's singletons, pacing, inputs, the Train form, run views, charts, code view."""
