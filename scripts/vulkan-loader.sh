# shellcheck shell=bash
# The Vulkan loader WebGPU needs, on a GPU machine that lacks one: the system's, else the
# carried .deb files (WHEELS), installed with dpkg as root, or unpacked into the venv's
# folder (VENV/vulkan, found through LD_LIBRARY_PATH) where that is not allowed or gave
# no loader: on the lent H200, 2026-11-26, `dpkg -i` left none and WebGPU saw no adapter,
# where the loader and glvnd's libraries unpacked by hand worked. scripts/gpu-check.sh
# sources this; tests/test_device_scripts.py drives it with stand-ins for ldconfig and dpkg.

has_vulkan_loader() { ldconfig -p 2>/dev/null | grep -q "libvulkan.so.1"; }

install_vulkan_loader() {
    has_vulkan_loader && return 0
    local debs=("$WHEELS"/*.deb) d
    [[ -e "${debs[0]}" ]] || { echo "no Vulkan loader and no .deb files in $WHEELS: WebGPU cannot run"; return 0; }
    if [[ $(id -u) -eq 0 ]] && command -v dpkg >/dev/null; then
        dpkg -i "${debs[@]}" >/dev/null 2>&1 || apt-get install -f -y -q >/dev/null 2>&1 || true
        has_vulkan_loader && return 0
        echo "dpkg -i gave no Vulkan loader: unpacking the .deb files instead"
    fi
    mkdir -p "$VENV/vulkan"  # with TARGET there is no venv: the folder is made for this
    for d in "${debs[@]}"; do
        dpkg -x "$d" "$VENV/vulkan" || { echo "could not unpack $d: WebGPU cannot run"; return 0; }
    done
    echo "Vulkan loader unpacked into $VENV/vulkan"
}

vulkan_env() {  # a loader unpacked into the venv's folder is found through this
    if [[ -d "$VENV/vulkan" && ":${LD_LIBRARY_PATH:-}:" != *":$VENV/vulkan/usr/lib/x86_64-linux-gnu:"* ]]; then
        export LD_LIBRARY_PATH="$VENV/vulkan/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
}
