package dra

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	drahealth "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

const node = "node-a"

var gpus = []resourceapi.Device{{Name: "gpu-1-128"}, {Name: "gpu-2-129"}, {Name: "gpu-3-130"}}

// eventLog is the driver's events file, read while its gRPC server writes.
type eventLog struct {
	mutex sync.Mutex
	buf   bytes.Buffer
}

func (l *eventLog) Write(p []byte) (int, error) {
	l.mutex.Lock()
	defer l.mutex.Unlock()
	return l.buf.Write(p)
}

func (l *eventLog) events(t *testing.T) []Event {
	t.Helper()
	l.mutex.Lock()
	defer l.mutex.Unlock()
	var out []Event
	for _, line := range strings.Split(strings.TrimSpace(l.buf.String()), "\n") {
		var e Event
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("event line %q: %v", line, err)
		}
		out = append(out, e)
	}
	return out
}

// claim is allocated the named devices of `pool` by this driver, and one of another driver.
func claim(uid, pool string, devices ...string) *resourceapi.ResourceClaim {
	results := []resourceapi.DeviceRequestAllocationResult{{Request: "nic", Driver: "nic.example.com", Pool: pool, Device: "nic-0"}}
	for _, d := range devices {
		results = append(results, resourceapi.DeviceRequestAllocationResult{Request: "gpus", Driver: DriverName, Pool: pool, Device: d})
	}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "claim-" + uid, Namespace: "ns", UID: types.UID(uid)},
		Status:     resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}},
	}
}

type started struct {
	helper    *kubeletplugin.Helper
	driver    *Driver
	client    *fake.Clientset
	log       *eventLog
	registry  string
	pluginDir string
}

// start runs the driver as its main does, its sockets in temporary directories.
func start(t *testing.T, objects ...*resourceapi.ResourceClaim) started {
	t.Helper()
	client := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}})
	for _, c := range objects {
		if _, err := client.ResourceV1().ResourceClaims(c.Namespace).Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	s := started{client: client, log: &eventLog{}, registry: t.TempDir(), pluginDir: t.TempDir()}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	fatal := func(err error) { t.Errorf("fatal: %v", err) }
	s.driver = New(node, gpus, s.log, fatal)
	helper, err := kubeletplugin.Start(ctx, s.driver,
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(node),
		kubeletplugin.DriverName(DriverName),
		kubeletplugin.RegistrarDirectoryPath(s.registry),
		kubeletplugin.PluginDataDirectoryPath(s.pluginDir),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(helper.Stop)
	s.helper = helper
	return s
}

func connect(t *testing.T, socket string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func (s started) dra(t *testing.T) drapb.DRAPluginClient {
	return drapb.NewDRAPluginClient(connect(t, filepath.Join(s.pluginDir, "dra.sock")))
}

func request(claims ...*resourceapi.ResourceClaim) []*drapb.Claim {
	var out []*drapb.Claim
	for _, c := range claims {
		out = append(out, &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)})
	}
	return out
}

func TestRegistersAsTheKubeletsPluginWatcherExpects(t *testing.T) {
	s := start(t)
	client := registerapi.NewRegistrationClient(connect(t, filepath.Join(s.registry, DriverName+"-reg.sock")))
	info, err := client.GetInfo(context.Background(), &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != registerapi.DRAPlugin || info.Name != DriverName || info.Endpoint != filepath.Join(s.pluginDir, "dra.sock") {
		t.Fatalf("GetInfo %v", info)
	}
	if len(info.SupportedVersions) == 0 || info.SupportedVersions[0] != drapb.DRAPluginService {
		t.Fatalf("the kubelet 1.36 dials %s first; the driver offers %v", drapb.DRAPluginService, info.SupportedVersions)
	}
	if !slices.Contains(info.SupportedVersions, drahealth.DRAResourceHealth_ServiceDesc.ServiceName) {
		t.Fatalf("no health service among %v", info.SupportedVersions)
	}
	if _, err := client.NotifyRegistrationStatus(context.Background(), &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s.driver.AwaitRegistration(ctx, s.helper)
	if events := s.log.events(t); len(events) != 1 || !eventsEqual(events[0], Event{Op: "registered"}) {
		t.Fatalf("events %v", events)
	}
}

func TestPreparesAClaimOfItsDevicesAndUnpreparesIt(t *testing.T) {
	c := claim("uid-1", node, "gpu-1-128", "gpu-2-129")
	s := start(t, c)
	prepared, err := s.dra(t).NodePrepareResources(context.Background(), &drapb.NodePrepareResourcesRequest{Claims: request(c)})
	if err != nil {
		t.Fatal(err)
	}
	answer := prepared.Claims["uid-1"]
	if answer == nil || answer.Error != "" || len(answer.Devices) != 2 {
		t.Fatalf("prepare answered %v", prepared.Claims)
	}
	for i, d := range answer.Devices {
		if d.PoolName != node || d.DeviceName != c.Status.Allocation.Devices.Results[i+1].Device || !slices.Equal(d.RequestNames, []string{"gpus"}) || len(d.CdiDeviceIds) != 0 {
			t.Fatalf("device %d: %v", i, d)
		}
	}
	unprepared, err := s.dra(t).NodeUnprepareResources(context.Background(), &drapb.NodeUnprepareResourcesRequest{Claims: request(c)})
	if err != nil || unprepared.Claims["uid-1"] == nil || unprepared.Claims["uid-1"].Error != "" {
		t.Fatalf("unprepare answered %v, %v", unprepared, err)
	}
	events := s.log.events(t)
	want := []Event{
		{Op: "prepare", Claim: "uid-1", Namespace: "ns", Name: "claim-uid-1", Devices: []string{"gpu-1-128", "gpu-2-129"}},
		{Op: "unprepare", Claim: "uid-1", Namespace: "ns", Name: "claim-uid-1", Devices: []string{"gpu-1-128", "gpu-2-129"}},
	}
	if len(events) != 2 || !eventsEqual(events[0], want[0]) || !eventsEqual(events[1], want[1]) {
		t.Fatalf("events %v, want %v", events, want)
	}
}

func eventsEqual(a, b Event) bool {
	return a.Op == b.Op && a.Claim == b.Claim && a.Namespace == b.Namespace && a.Name == b.Name && slices.Equal(a.Devices, b.Devices) && a.Error == b.Error
}

func TestRefusesADeviceOfAnotherNode(t *testing.T) {
	c := claim("uid-2", "node-b", "gpu-1-128")
	s := start(t, c)
	prepared, err := s.dra(t).NodePrepareResources(context.Background(), &drapb.NodePrepareResourcesRequest{Claims: request(c)})
	if err != nil {
		t.Fatal(err)
	}
	if answer := prepared.Claims["uid-2"]; answer == nil || !strings.Contains(answer.Error, "not one of node node-a's") {
		t.Fatalf("prepare answered %v", prepared.Claims)
	}
}

func TestRefusesADeviceAnotherClaimHoldsUntilItIsUnprepared(t *testing.T) {
	driver := New(node, gpus, &eventLog{}, func(err error) { t.Errorf("fatal: %v", err) })
	first, second := claim("uid-3", node, "gpu-3-130"), claim("uid-4", node, "gpu-2-129", "gpu-3-130")
	prepare := func(c *resourceapi.ResourceClaim) error {
		results, err := driver.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
		if err != nil {
			t.Fatal(err)
		}
		return results[c.UID].Err
	}
	if err := prepare(first); err != nil {
		t.Fatal(err)
	}
	if err := prepare(first); err != nil {
		t.Fatalf("preparing again: %v", err)
	}
	if err := prepare(second); err == nil || !strings.Contains(err.Error(), "gpu-3-130 is held by claim uid-3") {
		t.Fatalf("second claim: %v", err)
	}
	unprepare := []kubeletplugin.NamespacedObject{{NamespacedName: types.NamespacedName{Namespace: "ns", Name: first.Name}, UID: first.UID}}
	if _, err := driver.UnprepareResourceClaims(context.Background(), unprepare); err != nil {
		t.Fatal(err)
	}
	if err := prepare(second); err != nil {
		t.Fatalf("second claim once the first is unprepared: %v", err)
	}
}

func TestPublishesTheNodesResourceSlice(t *testing.T) {
	s := start(t)
	if err := s.helper.PublishResources(context.Background(), Resources(node, gpus)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		slices, err := s.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(slices.Items) == 1 {
			spec := slices.Items[0].Spec
			owner := slices.Items[0].OwnerReferences
			if spec.Driver != DriverName || *spec.NodeName != node || spec.Pool.Name != node || len(spec.Devices) != len(gpus) || len(owner) != 1 || owner[0].UID != "node-uid" {
				t.Fatalf("slice %v owned by %v", spec, owner)
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("no ResourceSlice published")
}

func TestLoadsTheHarnesssDevicesAndRefusesUnknownFields(t *testing.T) {
	dir := t.TempDir()
	good := `[{"name": "gpu-1-128", "attributes": {"numaNode": {"int": 0}, "driverVersion": {"version": "6.12.12"},
	  "resource.kubernetes.io/pciBusID": {"string": "0000:05:00.0"}}, "capacity": {"memory": {"value": "192Gi"}}}]`
	path := filepath.Join(dir, "devices.json")
	if err := os.WriteFile(path, []byte(good), 0o600); err != nil {
		t.Fatal(err)
	}
	devices, err := LoadDevices(path)
	if err != nil {
		t.Fatal(err)
	}
	d := devices[0]
	memory := d.Capacity["memory"].Value
	if d.Name != "gpu-1-128" || *d.Attributes["numaNode"].IntValue != 0 || *d.Attributes["driverVersion"].VersionValue != "6.12.12" || memory.String() != "192Gi" {
		t.Fatalf("device %+v", d)
	}
	if err := os.WriteFile(path, []byte(`[{"name": "gpu-1-128", "capacities": {}}]`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadDevices(path); err == nil || !strings.Contains(err.Error(), "capacities") {
		t.Fatalf("an unknown field: %v", err)
	}
}

func TestStreamsEveryDeviceHealthy(t *testing.T) {
	s := start(t)
	conn := connect(t, filepath.Join(s.pluginDir, "dra.sock"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := drahealth.NewDRAResourceHealthClient(conn).NodeWatchResources(ctx, &drahealth.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	answer, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var healthy []string
	for _, d := range answer.Devices {
		if d.Device.PoolName == node && d.Health == drahealth.HealthStatus_HEALTHY {
			healthy = append(healthy, d.Device.DeviceName)
		}
	}
	if !slices.Equal(healthy, []string{"gpu-1-128", "gpu-2-129", "gpu-3-130"}) {
		t.Fatalf("health %v", answer.Devices)
	}
}
