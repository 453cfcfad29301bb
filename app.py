"""gradacc: gradient accumulation, live. Run with ``streamlit run app.py`` (an installed gradacc: ``gradacc app``).

The app lives in the package (gradacc/app/streamlit_app.py); its pages in ``pages/``, next to this file.
"""

from gradacc.app.streamlit_app import main

main()
