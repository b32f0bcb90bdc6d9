// Package dra is a fake AMD GPU DRA driver, gpu.amd.com, behind the kubelet's own DRA plugin API: the
// kubeletplugin helper of k8s.io/dynamic-resource-allocation registers it with the kubelet's plugin
// watcher, serves the DRA gRPC service the kubelet calls (NodePrepareResources, NodeUnprepareResources)
// and publishes the node's ResourceSlice, as the real driver (ROCm/k8s-gpu-dra-driver) does. The
// devices are the harness's (a JSON list, e2e/resourceslices.py); preparing a claim hands out no device
// nodes (no CDI ids: the node's containerd 1.6 has no CDI), it checks and records what was allocated. It
// also streams the devices' health, always healthy, to the kubelet.
package dra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"slices"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	drahealth "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
)

// DriverName is the AMD GPU DRA driver's name, and its DeviceClass's.
const DriverName = "gpu.amd.com"

// Event is one call of the kubelet, as the driver records it (one JSON line each).
type Event struct {
	Op        string    `json:"op"` // "registered" (the kubelet's answer to the registration), "prepare" or "unprepare"
	Claim     types.UID `json:"claim,omitempty"`
	Namespace string    `json:"namespace,omitempty"`
	Name      string    `json:"name,omitempty"`
	Devices   []string  `json:"devices,omitempty"`
	Error     string    `json:"error,omitempty"`
}

// Driver prepares the claims allocated to its node's devices: its pool is the node's name.
type Driver struct {
	drahealth.UnimplementedDRAResourceHealthServer
	pool     string
	devices  map[string]bool
	events   io.Writer
	fatal    func(error)
	mutex    sync.Mutex
	prepared map[types.UID][]string // claim -> the devices it holds
}

// New is the driver of node `pool` with `devices`; each prepare and unprepare goes to `events` as a
// JSON line, and a background error that retrying cannot mend goes to `fatal`.
func New(pool string, devices []resourceapi.Device, events io.Writer, fatal func(error)) *Driver {
	names := map[string]bool{}
	for _, d := range devices {
		names[d.Name] = true
	}
	return &Driver{pool: pool, devices: names, events: events, fatal: fatal, prepared: map[types.UID][]string{}}
}

// LoadDevices reads the devices the harness wrote (a JSON list of resource.k8s.io/v1 Devices); an
// unknown field is an error, so a change of the harness's content cannot be dropped silently.
func LoadDevices(path string) ([]resourceapi.Device, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	decoder := json.NewDecoder(file)
	decoder.DisallowUnknownFields()
	var devices []resourceapi.Device
	if err := decoder.Decode(&devices); err != nil {
		return nil, fmt.Errorf("devices in %s: %w", path, err)
	}
	return devices, nil
}

// Resources is the node's one ResourceSlice: every device in the pool named after the node.
func Resources(pool string, devices []resourceapi.Device) resourceslice.DriverResources {
	slice := resourceslice.Slice{Devices: devices}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{pool: {Slices: []resourceslice.Slice{slice}}}}
}

// PrepareResourceClaims answers NodePrepareResources: each claim's devices of this driver, refused
// where one is not this node's or another claim holds it.
func (d *Driver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mutex.Lock()
	defer d.mutex.Unlock()
	results := map[types.UID]kubeletplugin.PrepareResult{}
	for _, claim := range claims {
		results[claim.UID] = d.prepare(claim)
	}
	return results, nil
}

func (d *Driver) prepare(claim *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	devices, err := d.allocated(claim)
	names := make([]string, len(devices))
	for i, device := range devices {
		names[i] = device.DeviceName
	}
	if err == nil {
		err = d.hold(claim.UID, names)
	}
	d.record(Event{Op: "prepare", Claim: claim.UID, Namespace: claim.Namespace, Name: claim.Name, Devices: names, Error: errorText(err)})
	if err != nil {
		return kubeletplugin.PrepareResult{Err: err}
	}
	return kubeletplugin.PrepareResult{Devices: devices}
}

// allocated lists the claim's devices of this driver, which must be in this node's pool.
func (d *Driver) allocated(claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	var devices []kubeletplugin.Device
	for _, result := range claim.Status.Allocation.Devices.Results {
		if result.Driver != DriverName {
			continue
		}
		if result.Pool != d.pool || !d.devices[result.Device] {
			return nil, fmt.Errorf("device %s/%s is not one of node %s's", result.Pool, result.Device, d.pool)
		}
		devices = append(devices, kubeletplugin.Device{Requests: []string{result.Request}, PoolName: result.Pool, DeviceName: result.Device})
	}
	return devices, nil
}

// hold gives `names` to the claim unless another prepared claim has one of them (the scheduler never
// allocates a device twice; the driver is the last line of defence). Preparing again is no change.
func (d *Driver) hold(claim types.UID, names []string) error {
	for other, held := range d.prepared {
		for _, name := range held {
			if other != claim && slices.Contains(names, name) {
				return fmt.Errorf("device %s is held by claim %s", name, other)
			}
		}
	}
	d.prepared[claim] = names
	return nil
}

// UnprepareResourceClaims answers NodeUnprepareResources: the claims' devices are free again. A claim
// this process never prepared (the driver restarted) is no error.
func (d *Driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mutex.Lock()
	defer d.mutex.Unlock()
	results := map[types.UID]error{}
	for _, claim := range claims {
		d.record(Event{Op: "unprepare", Claim: claim.UID, Namespace: claim.Namespace, Name: claim.Name, Devices: d.prepared[claim.UID]})
		delete(d.prepared, claim.UID)
		results[claim.UID] = nil
	}
	return results, nil
}

// AwaitRegistration records the kubelet's answer to the driver's registration (its plugin manager calls
// NotifyRegistrationStatus once it has validated the driver and dialled its DRA service), polled since
// the helper offers no callback.
func (d *Driver) AwaitRegistration(ctx context.Context, helper *kubeletplugin.Helper) {
	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()
	for {
		if status := helper.RegistrationStatus(); status != nil {
			d.mutex.Lock()
			defer d.mutex.Unlock()
			event := Event{Op: "registered", Error: status.Error}
			if !status.PluginRegistered && event.Error == "" {
				event.Error = "the kubelet refused the registration"
			}
			d.record(event)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// HandleError logs the helper's background errors; one that retrying cannot mend stops the driver.
func (d *Driver) HandleError(_ context.Context, err error, msg string) {
	log.Printf("%s: %v", msg, err)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) {
		d.fatal(fmt.Errorf("%s: %w", msg, err))
	}
}

func (d *Driver) record(event Event) {
	log.Printf("%s %s/%s (claim %s): devices %v %s", event.Op, event.Namespace, event.Name, event.Claim, event.Devices, event.Error)
	line, err := json.Marshal(event)
	if err == nil {
		_, err = d.events.Write(append(line, '\n'))
	}
	if err != nil {
		log.Printf("recording %s of claim %s: %v", event.Op, event.Claim, err)
	}
}

func errorText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
