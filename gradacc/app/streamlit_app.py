"""The app's entry script: its navigation (``gradacc.app.navigation``); every page lives in ``pages/``.

Two ways in, one app: ``streamlit run app.py`` in a checkout (app.py calls ``main()``; pages/ is next to it),
and ``gradacc app`` from an installed package, which runs this file itself (the wheel puts the checkout's
pages/ here as gradacc/app/pages/). Page paths are relative to the main script, so they hold in both. Run as a
script, this file is ``__main__``: what a page reads back (``under_navigation``) lives in an imported module.
"""

from gradacc.app.navigation import main

__all__ = ["main"]

if __name__ == "__main__":  # `gradacc app`: Streamlit runs this file as its main script
    main()
