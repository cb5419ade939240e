# vLLM with the vllm-patch series applied.
#
#   make image                  # default target "patched": apply the series in place
#   make image-wheel            # target "from-wheel": install dist/vllm-*+vp.*.whl instead
#
# The default base is the current line's pinned release (the top-level series, vLLM 0.33.0); the tool's
# wheel bundles every line (built from series, patches/ and lines/ by setup.py), and the image applies
# the one proven on the base image's vLLM, e.g. line v0.20 on
#   make image LINE=v0.20       # VLLM_IMAGE=vllm/vllm-openai:v0.20.0
# Pin the base image by digest for reproducible builds, e.g.
#   make image VLLM_IMAGE=vllm/vllm-openai:v0.33.0@sha256:<digest>
# (`docker buildx imagetools inspect vllm/vllm-openai:v0.33.0` prints the digest).
#
# The tool is installed from its own wheel, as users install it (no series next to a source tree),
# into a virtualenv of its own (/opt/vllm-patch/venv): nothing it needs is installed into vLLM's
# environment, whose `pip freeze` the build records before the series and compares after it (only
# the vllm line may differ, in the from-wheel target).
ARG VLLM_IMAGE=vllm/vllm-openai:v0.33.0
# The release line (empty: the one proven on the image's vLLM).
ARG LINE=

# The tool's wheel, with the release lines inside it; only the wheel leaves this stage.
FROM ${VLLM_IMAGE} AS tool-wheel
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY pyproject.toml setup.py MANIFEST.in README.md series /src/
COPY tool /src/tool
COPY patches /src/patches
COPY lines /src/lines
COPY guard /src/guard
RUN python3 -m pip wheel --no-cache-dir --no-deps /src /src/guard -w /wheels

FROM ${VLLM_IMAGE} AS tool
ARG LINE
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY --from=tool-wheel /wheels /tmp/tool-wheels
RUN mkdir -p /opt/vllm-patch \
    && python3 -m pip freeze --all > /opt/vllm-patch/freeze-before.txt \
    && python3 -m venv /opt/vllm-patch/venv \
    && /opt/vllm-patch/venv/bin/pip install --no-cache-dir /tmp/tool-wheels/vllm_patch-*.whl \
    && mv /tmp/tool-wheels/vllm_patch_guard-*.whl /opt/vllm-patch/ \
    && rm -rf /tmp/tool-wheels \
    && ln -s /opt/vllm-patch/venv/bin/vllm-patch /usr/local/bin/vllm-patch
ENV VLLM_PATCH_LINE=${LINE}
# The guard (guard/), installed into vLLM's environment after the freeze check: every vLLM start
# refuses to run if the series is not applied, applied partly, or another series is.
ENV VLLM_PATCH_GUARD=strict

FROM tool AS from-wheel
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY dist/ /tmp/dist/
RUN python3 -m pip install --no-cache-dir --no-deps --force-reinstall /tmp/dist/vllm-*+vp.*.whl \
    && rm -rf /tmp/dist
# The checks are steps of their own on purpose: a failing one names itself in the build log.
# hadolint ignore=DL3059
RUN vllm-patch status --python python3 --expect applied
# hadolint ignore=DL3059
RUN python3 -m pip freeze --all | grep -v '^vllm[=@ ]' > /tmp/freeze-after.txt \
    && grep -v '^vllm[=@ ]' /opt/vllm-patch/freeze-before.txt | diff - /tmp/freeze-after.txt \
    && rm /tmp/freeze-after.txt
# hadolint ignore=DL3059
RUN python3 -m pip install --no-cache-dir --no-deps /opt/vllm-patch/vllm_patch_guard-*.whl
# The guard's entry point as vLLM's plugin loader calls it (strict: fails the build if it would refuse).
# hadolint ignore=DL3059
RUN python3 -c "from importlib.metadata import entry_points; \
[ep.load()() for ep in entry_points(group='vllm.general_plugins') if ep.name == 'vllm_patch_guard']"

FROM tool AS patched
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN vllm-patch apply --python python3
# hadolint ignore=DL3059
RUN vllm-patch status --python python3 --expect applied
# hadolint ignore=DL3059
RUN python3 -m pip freeze --all | diff /opt/vllm-patch/freeze-before.txt -
# hadolint ignore=DL3059
RUN python3 -m pip install --no-cache-dir --no-deps /opt/vllm-patch/vllm_patch_guard-*.whl
# The guard's entry point as vLLM's plugin loader calls it (strict: fails the build if it would refuse).
# hadolint ignore=DL3059
RUN python3 -c "from importlib.metadata import entry_points; \
[ep.load()() for ep in entry_points(group='vllm.general_plugins') if ep.name == 'vllm_patch_guard']"
