// Package devplugins is a fake MI300X node's devices behind the kubelet's own device-plugin API
// (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1): the AMD GPU plugin's amd.com/gpu, the Mellanox
// shared-device plugin's rdma/hca_shared_devices_a and the AMD network operator's amd.com/nic. The
// device nodes are real character devices (mknod) with the real drivers' numbers, so containerd and
// runc pass them into containers and the device cgroup admits them; no driver answers them (open gives
// ENXIO). The decisions (devices, preferences, what Allocate answers) are pure functions of Node.
package devplugins

import (
	"fmt"
	"path/filepath"
	"strconv"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const (
	GPUResource        = "amd.com/gpu"
	SharedRDMAResource = "rdma/hca_shared_devices_a"
	NICResource        = "amd.com/nic"
	// SharedRDMACapacity is the Mellanox shared-device plugin's rdmaHcaMax default.
	SharedRDMACapacity = 1000
	// SysClassMount is where containers see the node's emulated sysfs device classes.
	SysClassMount = "/sys/class"
	drmMajor      = 226 // fixed (Documentation/admin-guide/devices.txt)
	verbsMajor    = 231 // infiniband: umad minors from 0, uverbs minors from 192
	miscMajor     = 10
	uverbsMinor   = 192
	renderMinor   = 128
)

// MI300X OAM boards: the PCI bus of each GPU on a typical 8-GPU platform (as e2e/resourceslices.py).
var mi300xBuses = []int{0x05, 0x26, 0x46, 0x65, 0x85, 0xa6, 0xc6, 0xe5}

// Node is what the fake node has. KFDMajor and RDMACMMinor stand for numbers the kernel hands out
// dynamically (amdkfd's char major, rdma_cm's misc minor); pick ones this kernel has not registered.
// NoUVerbs is a misconfigured node whose ib_uverbs module is not loaded: its NICs show in
// /sys/class/infiniband and have umad nodes (ib_umad) and rdma_cm (rdma_ucm), but no uverbs node and no
// infiniband_verbs class, so what the RDMA plugins hand out lacks them (see sharedRDMAResource).
type Node struct {
	Root        string // host directory holding dev/ and sys/class/ of the fake devices
	GPUs        int
	NICs        int
	NUMANodes   int
	KFDMajor    uint32
	RDMACMMinor uint32
	NoUVerbs    bool
}

// GPU is one whole MI300X (SPX/NPS1).
type GPU struct {
	Index int
	NUMA  int
}

// ID is the device ID the AMD plugin uses: the GPU's PCI address.
func (g GPU) ID() string {
	bus := 0xf8 + g.Index
	if g.Index < len(mi300xBuses) {
		bus = mi300xBuses[g.Index]
	}
	return fmt.Sprintf("0000:%02x:00.0", bus)
}

func (g GPU) Card() string   { return "card" + strconv.Itoa(g.Index+1) } // card0: the BMC's display
func (g GPU) Render() string { return "renderD" + strconv.Itoa(renderMinor+g.Index) }

// NIC is one RoCE NIC (AMD Pollara 400, ionic driver); NoUVerbs: its node lacks ib_uverbs.
type NIC struct {
	Index    int
	NUMA     int
	NoUVerbs bool
}

func (n NIC) Name() string   { return "ionic_" + strconv.Itoa(n.Index) }
func (n NIC) UVerbs() string { return "uverbs" + strconv.Itoa(n.Index) }
func (n NIC) UMAD() string   { return "umad" + strconv.Itoa(n.Index) }

func (n Node) numaOf(index, count int) int {
	if count == 0 || n.NUMANodes <= 1 {
		return 0
	}
	return index * n.NUMANodes / count
}

func (n Node) AllGPUs() []GPU {
	out := make([]GPU, n.GPUs)
	for i := range out {
		out[i] = GPU{Index: i, NUMA: n.numaOf(i, n.GPUs)}
	}
	return out
}

func (n Node) AllNICs() []NIC {
	out := make([]NIC, n.NICs)
	for i := range out {
		out[i] = NIC{Index: i, NUMA: n.numaOf(i, n.NICs), NoUVerbs: n.NoUVerbs}
	}
	return out
}

// CharDevice is one device node: its path in a container and its numbers.
type CharDevice struct {
	Path         string
	Major, Minor uint32
}

func (n Node) kfd() CharDevice { return CharDevice{"/dev/kfd", n.KFDMajor, 0} }

func (g GPU) devices() []CharDevice {
	return []CharDevice{
		{"/dev/dri/" + g.Card(), drmMajor, uint32(g.Index + 1)},
		{"/dev/dri/" + g.Render(), drmMajor, uint32(renderMinor + g.Index)},
	}
}

// devices: the NIC's umad node, and its uverbs node unless ib_uverbs is missing.
func (n NIC) devices() []CharDevice {
	out := []CharDevice{{"/dev/infiniband/" + n.UMAD(), verbsMajor, uint32(n.Index)}}
	if !n.NoUVerbs {
		out = append(out, CharDevice{"/dev/infiniband/" + n.UVerbs(), verbsMajor, uint32(uverbsMinor + n.Index)})
	}
	return out
}

func (n Node) rdmaCM() CharDevice {
	return CharDevice{"/dev/infiniband/rdma_cm", miscMajor, n.RDMACMMinor}
}

// CharDevices is every device node of the node (what a privileged container would see).
func (n Node) CharDevices() []CharDevice {
	out := []CharDevice{}
	if n.GPUs > 0 {
		out = append(out, n.kfd())
	}
	for _, g := range n.AllGPUs() {
		out = append(out, g.devices()...)
	}
	if n.NICs > 0 {
		out = append(out, n.rdmaCM())
	}
	for _, nic := range n.AllNICs() {
		out = append(out, nic.devices()...)
	}
	return out
}

// HostPath is where the node keeps a device node (the container sees it at d.Path).
func (n Node) HostPath(d CharDevice) string { return filepath.Join(n.Root, d.Path) }

// SysClassDir is the host directory mounted at /sys/class in containers with any of these devices.
func (n Node) SysClassDir() string { return filepath.Join(n.Root, "sys", "class") }

func topology(numa int) *pluginapi.TopologyInfo {
	return &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(numa)}}}
}
