package devplugins

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// fakeKubelet is the kubelet's Registration service on kubelet.sock.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	requests chan *pluginapi.RegisterRequest
	server   *grpc.Server
}

func (k *fakeKubelet) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.requests <- req
	return &pluginapi.Empty{}, nil
}

// startKubelet removes every socket in dir, as a starting kubelet does, and serves kubelet.sock.
func startKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		os.Remove(filepath.Join(dir, e.Name()))
	}
	listener, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelet{requests: make(chan *pluginapi.RegisterRequest, 8), server: grpc.NewServer()}
	pluginapi.RegisterRegistrationServer(k.server, k)
	go k.server.Serve(listener) //nolint:errcheck
	t.Cleanup(k.server.Stop)
	return k
}

func (k *fakeKubelet) registered(t *testing.T, count int) map[string]*pluginapi.RegisterRequest {
	t.Helper()
	out := map[string]*pluginapi.RegisterRequest{}
	for len(out) < count {
		select {
		case req := <-k.requests:
			out[req.ResourceName] = req
		case <-time.After(30 * time.Second):
			t.Fatalf("registered only %v", out)
		}
	}
	return out
}

func dial(t *testing.T, dir, socket string) pluginapi.DevicePluginClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, socket), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

func TestPluginsRegisterAndServeTheKubeletAPI(t *testing.T) {
	dir := t.TempDir()
	kubelet := startKubelet(t, dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go Serve(ctx, dir, mi300x.Resources()) //nolint:errcheck
	requests := kubelet.registered(t, 3)
	gpuReq := requests[GPUResource]
	if gpuReq == nil || gpuReq.Version != "v1beta1" || !gpuReq.Options.GetPreferredAllocationAvailable {
		t.Fatalf("GPU registration %v", gpuReq)
	}
	if requests[SharedRDMAResource].Options.GetPreferredAllocationAvailable {
		t.Fatal("the shared RDMA plugin has no preference")
	}

	gpu := dial(t, dir, gpuReq.Endpoint)
	stream, err := gpu.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	listed, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(listed.Devices) != 8 || listed.Devices[7].Topology.Nodes[0].ID != 1 {
		t.Fatalf("listed %v", listed.Devices)
	}
	preferred, err := gpu.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: ids(0, 1, 2, 3, 4, 5, 6, 7), AllocationSize: 4}},
	})
	if err != nil || !slices.Equal(preferred.ContainerResponses[0].DeviceIDs, ids(0, 1, 2, 3)) {
		t.Fatalf("preferred %v %v", preferred, err)
	}
	allocated, err := gpu.Allocate(ctx, &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids(0, 1, 2, 3)}, {DevicesIds: ids(4, 5, 6, 7)}},
	})
	if err != nil || len(allocated.ContainerResponses) != 2 || allocated.ContainerResponses[1].Devices[1].ContainerPath != "/dev/dri/card5" {
		t.Fatalf("allocated %v %v", allocated, err)
	}
}

func TestPluginsRegisterAgainWhenTheKubeletRestarts(t *testing.T) {
	dir := t.TempDir()
	first := startKubelet(t, dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go Serve(ctx, dir, mi300x.Resources()) //nolint:errcheck
	first.registered(t, 3)
	first.server.Stop()
	second := startKubelet(t, dir) // removes the plugins' sockets, makes kubelet.sock anew
	requests := second.registered(t, 3)
	stream, err := dial(t, dir, requests[NICResource].Endpoint).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if listed, err := stream.Recv(); err != nil || len(listed.Devices) != 8 {
		t.Fatalf("after the restart: %v %v", listed, err)
	}
}

func TestWriteTreeMakesCharDevices(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mknod needs root")
	}
	node := mi300x
	node.Root = t.TempDir()
	if err := node.WriteTree(); err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(filepath.Join(node.Root, "dev/dri/renderD128"))
	if err != nil || info.Mode()&os.ModeCharDevice == 0 {
		t.Fatalf("renderD128: %v %v", info, err)
	}
	if _, err := os.Stat(filepath.Join(node.Root, "sys/class/infiniband/ionic_0/ports/1/state")); err != nil {
		t.Fatal(err)
	}
	if err := node.WriteTree(); err != nil {
		t.Fatalf("a second run replaces the tree: %v", err)
	}
}
