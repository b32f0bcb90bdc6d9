package devplugins

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Resource is one extended resource as its device plugin serves it.
type Resource struct {
	Name    string
	Socket  string // file name in the kubelet's device-plugins directory
	Devices []*pluginapi.Device
	// Allocate answers for one container's device IDs.
	Allocate func(ids []string) (*pluginapi.ContainerAllocateResponse, error)
	// Prefer picks `size` of `available` including `must`; nil: the plugin gives no preference.
	Prefer func(available, must []string, size int) []string
}

// Resources is what the node's plugins serve: GPUs if it has any, the RDMA resources if it has NICs.
func (n Node) Resources() []Resource {
	out := []Resource{}
	if n.GPUs > 0 {
		out = append(out, n.gpuResource())
	}
	if n.NICs > 0 {
		out = append(out, n.sharedRDMAResource(), n.nicResource())
	}
	return out
}

// gpuResource: the AMD GPU device plugin (ROCm/k8s-device-plugin, plugin.go Allocate): /dev/kfd (one
// per node, whatever the count) plus each GPU's card and render node, no environment; device IDs are
// PCI addresses, each with its NUMA node.
func (n Node) gpuResource() Resource {
	gpus := n.AllGPUs()
	byID := map[string]GPU{}
	devices := make([]*pluginapi.Device, len(gpus))
	for i, g := range gpus {
		byID[g.ID()] = g
		devices[i] = &pluginapi.Device{ID: g.ID(), Health: pluginapi.Healthy, Topology: topology(g.NUMA)}
	}
	prefer := func(available, must []string, size int) []string {
		return PreferContiguous(gpus, available, must, size)
	}
	return Resource{Name: GPUResource, Socket: "pd-fake-amd-gpu.sock", Devices: devices,
		Allocate: allocator(n, GPUResource, byID, n.kfd()), Prefer: prefer}
}

// sharedRDMAResource: the Mellanox shared-device plugin, SharedRDMACapacity interchangeable units for
// any number of containers. Allocate hands out what the plugin's discovery found for its NICs (rdmamap's
// GetRdmaCharDevices: rdma_cm and each NIC's umad and uverbs nodes). On a node without ib_uverbs
// (NoUVerbs) that is rdma_cm and the umad nodes, the units still advertised: the plugin's answer before
// v1.1.0, which since drops a NIC lacking any of the three at discovery and, with no NIC left,
// advertises no unit (docs/e2e-real-node.md, "The misconfigured node").
func (n Node) sharedRDMAResource() Resource {
	devices := make([]*pluginapi.Device, SharedRDMACapacity)
	for i := range devices {
		devices[i] = &pluginapi.Device{ID: "hca_shared_devices_a-" + strconv.Itoa(i), Health: pluginapi.Healthy}
	}
	every := []CharDevice{n.rdmaCM()}
	for _, nic := range n.AllNICs() {
		every = append(every, nic.devices()...)
	}
	allocate := func([]string) (*pluginapi.ContainerAllocateResponse, error) { return n.answer(every), nil }
	return Resource{Name: SharedRDMAResource, Socket: "pd-fake-rdma-shared.sock", Devices: devices, Allocate: allocate}
}

// nicResource: the AMD network operator's amd.com/nic, one NIC per unit, exclusive.
func (n Node) nicResource() Resource {
	nics := n.AllNICs()
	byID := map[string]NIC{}
	devices := make([]*pluginapi.Device, len(nics))
	for i, nic := range nics {
		byID[nic.Name()] = nic
		devices[i] = &pluginapi.Device{ID: nic.Name(), Health: pluginapi.Healthy, Topology: topology(nic.NUMA)}
	}
	return Resource{Name: NICResource, Socket: "pd-fake-amd-nic.sock", Devices: devices,
		Allocate: allocator(n, NICResource, byID, n.rdmaCM())}
}

type hasDevices interface{ devices() []CharDevice }

// allocator answers with `shared` and the device nodes of each allocated ID.
func allocator[T hasDevices](n Node, resource string, byID map[string]T, shared CharDevice) func([]string) (*pluginapi.ContainerAllocateResponse, error) {
	return func(ids []string) (*pluginapi.ContainerAllocateResponse, error) {
		devices := []CharDevice{shared}
		for _, id := range ids {
			device, ok := byID[id]
			if !ok {
				return nil, fmt.Errorf("%s: no device %q on this node", resource, id)
			}
			devices = append(devices, device.devices()...)
		}
		return n.answer(devices), nil
	}
}

// answer mounts the device nodes and the node's emulated sysfs classes (the same host directory for
// every resource, so the kubelet merges the mounts of a container's several resources into one).
func (n Node) answer(devices []CharDevice) *pluginapi.ContainerAllocateResponse {
	specs := make([]*pluginapi.DeviceSpec, len(devices))
	for i, d := range devices {
		specs[i] = &pluginapi.DeviceSpec{ContainerPath: d.Path, HostPath: n.HostPath(d), Permissions: "rw"}
	}
	mount := &pluginapi.Mount{ContainerPath: SysClassMount, HostPath: n.SysClassDir(), ReadOnly: true}
	return &pluginapi.ContainerAllocateResponse{Devices: specs, Mounts: []*pluginapi.Mount{mount}}
}

// PreferContiguous picks `size` GPUs out of `available` (which holds `must`): the lowest-numbered run
// of consecutive GPUs on one NUMA node that holds `must`, else any such run across NUMA nodes, else
// `must` and the lowest available. On MI300X (all GPUs XGMI-linked, two sockets) it gives what the AMD
// plugin's best-effort policy scores best, a NUMA-local quad, and what the project's ranges expect:
// 0-3 for the first 4-GPU container, 4-7 for the second.
func PreferContiguous(gpus []GPU, available, must []string, size int) []string {
	free := map[string]bool{}
	for _, id := range available {
		free[id] = true
	}
	for _, sameNUMA := range []bool{true, false} {
		for start := 0; start+size <= len(gpus); start++ {
			run := gpus[start : start+size]
			if runFits(run, free, must, sameNUMA) {
				ids := make([]string, size)
				for i, g := range run {
					ids[i] = g.ID()
				}
				return ids
			}
		}
	}
	picked := slices.Clone(must)
	for _, g := range gpus {
		if len(picked) >= size {
			break
		}
		if free[g.ID()] && !slices.Contains(picked, g.ID()) {
			picked = append(picked, g.ID())
		}
	}
	return picked
}

func runFits(run []GPU, free map[string]bool, must []string, sameNUMA bool) bool {
	ids := make([]string, len(run))
	for i, g := range run {
		if !free[g.ID()] || (sameNUMA && g.NUMA != run[0].NUMA) {
			return false
		}
		ids[i] = g.ID()
	}
	for _, id := range must {
		if !slices.Contains(ids, id) {
			return false
		}
	}
	return true
}

// Describe is a one-line summary for the log.
func (r Resource) Describe() string {
	return fmt.Sprintf("%s: %d devices (%s...)", r.Name, len(r.Devices), strings.Join(firstIDs(r.Devices, 2), ", "))
}

func firstIDs(devices []*pluginapi.Device, count int) []string {
	ids := []string{}
	for _, d := range devices[:min(count, len(devices))] {
		ids = append(ids, d.ID)
	}
	return ids
}
