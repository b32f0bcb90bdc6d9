package devplugins

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

const (
	cpuCoresPerSocket = 96
	mi300xSIMDs       = 1216
)

// Files is the node's emulated sysfs device classes (path under sys/class -> content), as a container
// with every device would read them: the KFD topology (CPU sockets first, then one node per GPU), drm
// entries with the partition modes, and the RDMA classes. A real container with a device cgroup reads
// EPERM for the other GPUs' KFD properties; a bind-mounted tree cannot, so every container sees all.
func (n Node) Files() map[string]string {
	files := map[string]string{}
	kfd := "kfd/kfd/topology/nodes/"
	for s := range n.NUMANodes {
		files[kfd+strconv.Itoa(s)+"/properties"] = fmt.Sprintf("cpu_cores_count %d\nsimd_count 0\nnode_id %d\n", cpuCoresPerSocket, s)
	}
	for _, g := range n.AllGPUs() {
		node := n.NUMANodes + g.Index
		files[kfd+strconv.Itoa(node)+"/properties"] = fmt.Sprintf(
			"cpu_cores_count 0\nsimd_count %d\nnode_id %d\ndrm_render_minor %d\n", mi300xSIMDs, node, renderMinor+g.Index)
		for _, entry := range []string{g.Card(), g.Render()} {
			files["drm/"+entry+"/device/current_compute_partition"] = "SPX\n"
			files["drm/"+entry+"/device/current_memory_partition"] = "NPS1\n"
			files["drm/"+entry+"/device/vendor"] = "0x1002\n"
			files["drm/"+entry+"/device/device"] = "0x74a1\n"
			files["drm/"+entry+"/device/numa_node"] = strconv.Itoa(g.NUMA) + "\n"
		}
	}
	for _, nic := range n.AllNICs() {
		port := "infiniband/" + nic.Name() + "/ports/1/"
		files[port+"state"] = "4: ACTIVE\n"
		files[port+"link_layer"] = "Ethernet\n"
		files["infiniband/"+nic.Name()+"/device/numa_node"] = strconv.Itoa(nic.NUMA) + "\n"
		if !nic.NoUVerbs {
			files["infiniband_verbs/"+nic.UVerbs()+"/ibdev"] = nic.Name() + "\n"
		}
	}
	return files
}

// WriteTree makes the node's device nodes and sysfs classes under Root, replacing any earlier tree.
func (n Node) WriteTree() error {
	if err := n.checkNumbersFree(); err != nil {
		return err
	}
	for _, d := range n.CharDevices() {
		path := n.HostPath(d)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := unix.Mknod(path, unix.S_IFCHR|0o666, int(unix.Mkdev(d.Major, d.Minor))); err != nil {
			return fmt.Errorf("mknod %s: %w", path, err)
		}
	}
	if err := os.RemoveAll(n.SysClassDir()); err != nil {
		return err
	}
	for _, class := range []string{"kfd", "drm", "infiniband", "infiniband_verbs"} {
		if err := os.MkdirAll(filepath.Join(n.SysClassDir(), class), 0o755); err != nil {
			return err
		}
	}
	for name, content := range n.Files() {
		path := filepath.Join(n.SysClassDir(), name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(content), 0o444); err != nil {
			return err
		}
	}
	return nil
}

// checkNumbersFree refuses device numbers this kernel has given a driver: a container allowed such a
// node would reach a real device of the machine.
func (n Node) checkNumbersFree() error {
	majors, err := registered("/proc/devices", "Block devices:")
	if err != nil {
		return err
	}
	misc, err := registered("/proc/misc", "")
	if err != nil {
		return err
	}
	for _, d := range n.CharDevices() {
		if d.Major == miscMajor && misc[d.Minor] || d.Major != miscMajor && majors[d.Major] {
			return fmt.Errorf("%s: %d:%d belongs to a driver of this kernel; choose another number", d.Path, d.Major, d.Minor)
		}
	}
	return nil
}

// registered reads the leading numbers of a /proc table up to the line `stop`.
func registered(path, stop string) (map[uint32]bool, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	out := map[uint32]bool{}
	scanner := bufio.NewScanner(file)
	for scanner.Scan() {
		line := strings.TrimSpace(scanner.Text())
		if stop != "" && line == stop {
			break
		}
		if number, err := strconv.ParseUint(strings.Fields(line + " x")[0], 10, 32); err == nil {
			out[uint32(number)] = true
		}
	}
	return out, scanner.Err()
}
