package dra

import (
	"maps"
	"slices"
	"time"

	"google.golang.org/grpc"
	drahealth "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
)

// healthEvery is how often the devices' health is sent again: the kubelet takes a report older than its
// health check timeout (30 s by default) for unknown.
const healthEvery = 10 * time.Second

// NodeWatchResources answers the kubelet's health stream (its ResourceHealthStatus feature, on by default
// in 1.36, which shows each prepared device's health in the pod's status): every device of the node is
// healthy, since the fake devices never fail. Without it the kubelet logs an error every 5 s.
func (d *Driver) NodeWatchResources(_ *drahealth.NodeWatchResourcesRequest, stream grpc.ServerStreamingServer[drahealth.NodeWatchResourcesResponse]) error {
	ticker := time.NewTicker(healthEvery)
	defer ticker.Stop()
	for {
		if err := stream.Send(d.allHealthy()); err != nil {
			return err
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-ticker.C:
		}
	}
}

func (d *Driver) allHealthy() *drahealth.NodeWatchResourcesResponse {
	now := time.Now().Unix()
	var devices []*drahealth.DeviceHealth
	for _, name := range slices.Sorted(maps.Keys(d.devices)) {
		device := &drahealth.DeviceIdentifier{PoolName: d.pool, DeviceName: name}
		devices = append(devices, &drahealth.DeviceHealth{Device: device, Health: drahealth.HealthStatus_HEALTHY, LastUpdatedTime: now})
	}
	return &drahealth.NodeWatchResourcesResponse{Devices: devices}
}
