# gradacc on Hugging Face Spaces (Docker SDK). The Space's README front matter needs
# `sdk: docker` and `app_port: 8501`.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Dependencies first, so a code change does not reinstall torch. Spaces builds online: the PyTorch CPU
# index makes the exact pin torch==2.13.0 resolve to 2.13.0+cpu instead of the multi-GB CUDA build.
COPY requirements.txt /tmp/requirements.txt
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu -r /tmp/requirements.txt

# Spaces runs the container as UID 1000.
RUN useradd -m -u 1000 user
USER user
ENV HOME=/home/user
WORKDIR /home/user/app
COPY --chown=user . .

# Spaces' disk is wiped on restart, so runs and caches live in /tmp. Limits for a public,
# CPU-only demo; each can be changed in the Space's settings (variables override these).
# GRADACC_MAX_RUN_MEMORY_MB: CPU Basic has 16 GB for the server and its runs. A run's measured need
# (parameters, gradients, optimizer state, saved activations) leaves out backward's temporaries and the
# allocator's slack, which can be as large again; 6 GB of need, doubled, plus the server (~1 GB with torch
# imported) stays under 16 GB with one run at a time.
ENV GRADACC_HOME=/tmp/gradacc \
    GRADACC_DEVICE=cpu \
    GRADACC_MAX_CONCURRENT_RUNS=1 \
    GRADACC_MAX_RUN_SECONDS=300 \
    GRADACC_MAX_EPOCHS=5 \
    GRADACC_MAX_TRAIN_SAMPLES=5000 \
    GRADACC_MAX_UPLOAD_MB=5 \
    GRADACC_ALLOW_HUB=0 \
    GRADACC_MAX_RUN_MEMORY_MB=6000 \
    GRADACC_DATA_DIRS=/tmp/gradacc/uploads

EXPOSE 8501
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8501/_stcore/health', timeout=4)"

# Exec form: streamlit is PID 1 and gets the SIGTERM of a restart (a shell would swallow it).
CMD ["streamlit", "run", "app.py", "--server.port=8501", "--server.address=0.0.0.0"]
