"""The one part of the build pyproject.toml cannot say: the app's files go into the package.

A checkout keeps the Streamlit pages at its root (``streamlit run app.py`` finds ``pages/`` beside it); an
installed gradacc needs them inside the package, beside ``gradacc/app/streamlit_app.py``, which
``gradacc app`` runs. So the wheel maps ``pages/`` to ``gradacc/app/pages/`` and ``.streamlit/`` (the
server's settings) to ``gradacc/app/streamlit_config/``: nothing is copied or kept twice.
"""

from setuptools import find_packages, setup

APP_FILES = {"gradacc.app.pages": "pages", "gradacc.app.streamlit_config": ".streamlit"}

setup(
    packages=find_packages(include=["gradacc", "gradacc.*"]) + list(APP_FILES),
    package_dir=APP_FILES,
    package_data={"gradacc.app.streamlit_config": ["config.toml"],
                  "gradacc.training.sources": ["tiny_bert_tokenizer/*.json", "builtin_pairs.json"],
                  "gradacc.app": ["trainer_default_by_family.json"],
                  # gradacc audit -- python train.py: the folder put first on the script's PYTHONPATH
                  "gradacc.training.audit": ["site/sitecustomize.py"],
                  "gradacc.app.live_chart": ["live_chart.js", "page_look.js"],
                  "gradacc.app.replay": ["page.html", "replay.js", "replay.css"]},
)
