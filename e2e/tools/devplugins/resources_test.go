package devplugins

import (
	"slices"
	"strings"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

var mi300x = Node{Root: "/node", GPUs: 8, NICs: 8, NUMANodes: 2, KFDMajor: 510, RDMACMMinor: 58}

func ids(gpus ...int) []string {
	out := []string{}
	for _, i := range gpus {
		out = append(out, GPU{Index: i}.ID())
	}
	return out
}

func TestPreferContiguousGivesTheRangesInOrder(t *testing.T) {
	gpus := mi300x.AllGPUs()
	first := PreferContiguous(gpus, ids(0, 1, 2, 3, 4, 5, 6, 7), nil, 4)
	if !slices.Equal(first, ids(0, 1, 2, 3)) {
		t.Fatalf("first quad: %v", first)
	}
	second := PreferContiguous(gpus, ids(4, 5, 6, 7), nil, 4)
	if !slices.Equal(second, ids(4, 5, 6, 7)) {
		t.Fatalf("second quad: %v", second)
	}
}

func TestPreferContiguousStaysOnOneNUMANodeAndHoldsMust(t *testing.T) {
	gpus := mi300x.AllGPUs()
	// 2-5 is contiguous but spans both sockets; 4-7 is the NUMA-local run holding GPU 5
	got := PreferContiguous(gpus, ids(2, 3, 4, 5, 6, 7), ids(5), 4)
	if !slices.Equal(got, ids(4, 5, 6, 7)) {
		t.Fatalf("got %v", got)
	}
	// no NUMA-local run of 4 is free: a contiguous one across the sockets
	got = PreferContiguous(gpus, ids(2, 3, 4, 5, 7), nil, 4)
	if !slices.Equal(got, ids(2, 3, 4, 5)) {
		t.Fatalf("got %v", got)
	}
	// nothing contiguous: must first, then the lowest
	got = PreferContiguous(gpus, ids(0, 2, 4, 6), ids(6), 3)
	if !slices.Equal(got, ids(6, 0, 2)) {
		t.Fatalf("got %v", got)
	}
}

func TestGPUAllocateMountsKFDAndTheGPUsNodesOnly(t *testing.T) {
	gpu := mi300x.gpuResource()
	answer, err := gpu.Allocate(ids(4, 5))
	if err != nil {
		t.Fatal(err)
	}
	paths := []string{}
	for _, d := range answer.Devices {
		if d.HostPath != "/node"+d.ContainerPath || d.Permissions != "rw" {
			t.Fatalf("device %v", d)
		}
		paths = append(paths, d.ContainerPath)
	}
	want := []string{"/dev/kfd", "/dev/dri/card5", "/dev/dri/renderD132", "/dev/dri/card6", "/dev/dri/renderD133"}
	if !slices.Equal(paths, want) {
		t.Fatalf("paths %v", paths)
	}
	if len(answer.Envs) != 0 {
		t.Fatalf("the AMD plugin sets no environment: %v", answer.Envs)
	}
	if len(answer.Mounts) != 1 || answer.Mounts[0].ContainerPath != "/sys/class" || !answer.Mounts[0].ReadOnly {
		t.Fatalf("mounts %v", answer.Mounts)
	}
	if _, err := gpu.Allocate([]string{"0000:ff:00.0"}); err == nil {
		t.Fatal("an unknown GPU was allocated")
	}
}

func TestGPUDevicesCarryTheirNUMANode(t *testing.T) {
	numa := []int64{}
	for _, d := range mi300x.gpuResource().Devices {
		if d.Health != pluginapi.Healthy {
			t.Fatalf("%v", d)
		}
		numa = append(numa, d.Topology.Nodes[0].ID)
	}
	if !slices.Equal(numa, []int64{0, 0, 0, 0, 1, 1, 1, 1}) {
		t.Fatalf("numa %v", numa)
	}
}

func TestSharedRDMAMountsEveryNIC(t *testing.T) {
	shared := mi300x.sharedRDMAResource()
	if len(shared.Devices) != SharedRDMACapacity || shared.Prefer != nil {
		t.Fatalf("%d devices", len(shared.Devices))
	}
	answer, _ := shared.Allocate([]string{shared.Devices[7].ID})
	if len(answer.Devices) != 1+2*mi300x.NICs || answer.Devices[0].ContainerPath != "/dev/infiniband/rdma_cm" {
		t.Fatalf("devices %v", answer.Devices)
	}
	if answer.Devices[2].ContainerPath != "/dev/infiniband/uverbs0" {
		t.Fatalf("devices %v", answer.Devices)
	}
}

func TestWithoutUVerbsTheRDMAResourcesStayButHandOutNoUVerbs(t *testing.T) {
	broken := mi300x
	broken.NoUVerbs = true
	shared := broken.sharedRDMAResource()
	if len(shared.Devices) != SharedRDMACapacity {
		t.Fatalf("%d devices advertised", len(shared.Devices))
	}
	answer, _ := shared.Allocate([]string{shared.Devices[0].ID})
	paths := []string{}
	for _, d := range answer.Devices {
		paths = append(paths, d.ContainerPath)
	}
	if len(paths) != 1+broken.NICs || paths[0] != "/dev/infiniband/rdma_cm" || paths[1] != "/dev/infiniband/umad0" {
		t.Fatalf("devices %v", paths)
	}
	nic, _ := broken.nicResource().Allocate([]string{"ionic_3"})
	if len(nic.Devices) != 2 || nic.Devices[1].ContainerPath != "/dev/infiniband/umad3" {
		t.Fatalf("devices %v", nic.Devices)
	}
	for _, d := range broken.CharDevices() {
		if strings.Contains(d.Path, "uverbs") {
			t.Fatalf("the node has %s", d.Path)
		}
	}
	files := broken.Files()
	if files["infiniband/ionic_0/ports/1/state"] == "" {
		t.Fatal("the NICs still show in /sys/class/infiniband")
	}
	for name := range files {
		if strings.HasPrefix(name, "infiniband_verbs/") {
			t.Fatalf("sysfs has %s", name)
		}
	}
}

func TestNICAllocateIsPerNIC(t *testing.T) {
	answer, err := mi300x.nicResource().Allocate([]string{"ionic_3"})
	if err != nil {
		t.Fatal(err)
	}
	if len(answer.Devices) != 3 || answer.Devices[2].ContainerPath != "/dev/infiniband/uverbs3" {
		t.Fatalf("devices %v", answer.Devices)
	}
}

func TestSysfsShowsWhatPreflightReads(t *testing.T) {
	files := mi300x.Files()
	if files["kfd/kfd/topology/nodes/0/properties"] == "" || files["kfd/kfd/topology/nodes/9/properties"] == "" {
		t.Fatal("KFD topology: two sockets then eight GPUs")
	}
	if files["drm/renderD135/device/current_compute_partition"] != "SPX\n" {
		t.Fatal("partition modes")
	}
	if files["infiniband/ionic_7/ports/1/state"] != "4: ACTIVE\n" {
		t.Fatal("RDMA class")
	}
}
