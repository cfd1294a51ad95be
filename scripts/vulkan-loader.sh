# shellcheck shell=bash
# The Vulkan loader WebGPU needs, on a GPU machine that lacks one: the system's, else the
# carried .deb files (WHEELS: libvulkan1 and glvnd's libraries, which NVIDIA's Vulkan
# driver loads) unpacked into the venv's folder (VENV/vulkan) and found through
# LD_LIBRARY_PATH. Not `dpkg -i`: on the lent H200 (2026-11-26) it left no loader, and on
# the lent H100 (2026-11-26) one that ldconfig listed while wgpu saw no adapter; unpacked
# this way the same files gave WebGPU the H100 (unpacked by hand into /, the H200).
# Unpacking needs no root and leaves the system's packages alone. scripts/gpu-check.sh
# sources this;
# tests/gpu/test_device_scripts.py drives it with a stand-in ldconfig.

has_vulkan_loader() { ldconfig -p 2>/dev/null | grep -q "libvulkan.so.1"; }

install_vulkan_loader() {
    has_vulkan_loader && { echo "Vulkan loader: the system's"; return 0; }
    local debs=("$WHEELS"/*.deb) d
    [[ -e "${debs[0]}" ]] || { echo "no Vulkan loader and no .deb files in $WHEELS: WebGPU cannot run"; return 0; }
    mkdir -p "$VENV/vulkan"  # with TARGET there is no venv: the folder is made for this
    for d in "${debs[@]}"; do
        dpkg -x "$d" "$VENV/vulkan" || { echo "could not unpack $d: WebGPU cannot run"; return 0; }
    done
    echo "Vulkan loader unpacked into $VENV/vulkan from ${#debs[@]} .deb files:" \
        "$(cd "$VENV/vulkan/usr/lib/x86_64-linux-gnu" 2>/dev/null && echo ./*.so.*)"
}

vulkan_env() {  # a loader unpacked into the venv's folder is found through this
    if [[ -d "$VENV/vulkan" && ":${LD_LIBRARY_PATH:-}:" != *":$VENV/vulkan/usr/lib/x86_64-linux-gnu:"* ]]; then
        export LD_LIBRARY_PATH="$VENV/vulkan/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
}
