# vLLM with the vllm-patch series applied.
#
#   make image                  # default target "patched": apply the series in place
#   make image-wheel            # target "from-wheel": install dist/vllm-*+vp.*.whl instead
#
# Pin the base image by digest for reproducible builds, e.g.
#   docker build --build-arg VLLM_IMAGE=vllm/vllm-openai:v0.20.0@sha256:<digest> .
# (`docker buildx imagetools inspect vllm/vllm-openai:v0.20.0` prints the digest).
ARG VLLM_IMAGE=vllm/vllm-openai:v0.20.0

FROM ${VLLM_IMAGE} AS tool
COPY pyproject.toml README.md series /opt/vllm-patch/
COPY tool /opt/vllm-patch/tool
COPY patches /opt/vllm-patch/patches
RUN python3 -m pip install --no-cache-dir /opt/vllm-patch

FROM tool AS from-wheel
COPY dist/ /tmp/dist/
RUN python3 -m pip install --no-cache-dir --no-deps --force-reinstall /tmp/dist/vllm-0.20.0+vp.*.whl
# The check is its own step on purpose: a failing status names itself in the build log.
# hadolint ignore=DL3059
RUN vllm-patch --series /opt/vllm-patch status --python python3 --expect applied

FROM tool AS patched
RUN vllm-patch --series /opt/vllm-patch apply --python python3
# hadolint ignore=DL3059
RUN vllm-patch --series /opt/vllm-patch status --python python3 --expect applied
