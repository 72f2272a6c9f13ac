# A CPU image that serves one trained run over HTTP (docs/deploy.md):
#   docker build -t seqrec .
#   docker run -p 8000:8000 -v "$PWD/runs/sasrec-ce:/run:ro" -e SEQREC_API_KEY=change-me seqrec
FROM python:3.11-slim
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# torch first, its CPU build: an unpinned torch from PyPI is the multi-GB CUDA one
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md LICENSE ./
COPY src ./src
RUN pip install '.[serve]' && useradd --create-home seqrec
USER seqrec
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=3s \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/ready', timeout=2)"
# listening beyond the loopback needs a token: the key comes from $SEQREC_API_KEY
ENTRYPOINT ["seqrec", "serve", "/run", "--host", "0.0.0.0", "--port", "8000", "--api-key-env", "SEQREC_API_KEY"]
