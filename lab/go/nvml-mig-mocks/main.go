// Command nvml-mig-mocks prints, as JSON, what NVIDIA's go-nvml mock servers (dgxa100, dgxh100, dgxh200, dgxb200)
// answer through the NVML interface for device 0: name, PCI device id (nvmlDeviceGetPciInfo's pciDeviceId, device
// id in the high 16 bits, vendor in the low), memory, and every GPU instance profile with its possible placements and
// the compute instance profiles (and their placements) of a GPU instance of that profile.
//
// It is an oracle for the project's MIG tables (tests/unit/test_mig_oracle.py); it writes nothing but stdout.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxb200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
)

// NVML's GPU_INSTANCE_PROFILE_* constants by value (nvml.h), so the JSON names what each entry is.
var giProfileNames = map[int]string{
	nvml.GPU_INSTANCE_PROFILE_1_SLICE: "1_SLICE", nvml.GPU_INSTANCE_PROFILE_2_SLICE: "2_SLICE",
	nvml.GPU_INSTANCE_PROFILE_3_SLICE: "3_SLICE", nvml.GPU_INSTANCE_PROFILE_4_SLICE: "4_SLICE",
	nvml.GPU_INSTANCE_PROFILE_7_SLICE: "7_SLICE", nvml.GPU_INSTANCE_PROFILE_8_SLICE: "8_SLICE",
	nvml.GPU_INSTANCE_PROFILE_6_SLICE: "6_SLICE", nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1: "1_SLICE_REV1",
	nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1: "2_SLICE_REV1", nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2: "1_SLICE_REV2",
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX: "1_SLICE_GFX", nvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX: "2_SLICE_GFX",
	nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX: "4_SLICE_GFX", nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME: "1_SLICE_NO_ME",
	nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME: "2_SLICE_NO_ME", nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME: "1_SLICE_ALL_ME",
	nvml.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME: "2_SLICE_ALL_ME", nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX: "3_SLICE_GFX",
}

type placement struct {
	Start uint32 `json:"start"`
	Size  uint32 `json:"size"`
}

type ciProfile struct {
	Profile             int         `json:"profile"`
	SliceCount          uint32      `json:"slice_count"`
	InstanceCount       uint32      `json:"instance_count"`
	MultiprocessorCount uint32      `json:"multiprocessor_count"`
	Placements          []placement `json:"placements"`
}

type giProfile struct {
	Profile             int         `json:"profile"`
	ProfileName         string      `json:"profile_name"`
	ID                  uint32      `json:"id"`
	SliceCount          uint32      `json:"slice_count"`
	InstanceCount       uint32      `json:"instance_count"`
	MemorySizeMB        uint64      `json:"memory_size_mb"`
	MultiprocessorCount uint32      `json:"multiprocessor_count"`
	CopyEngineCount     uint32      `json:"copy_engine_count"`
	DecoderCount        uint32      `json:"decoder_count"`
	EncoderCount        uint32      `json:"encoder_count"`
	JpegCount           uint32      `json:"jpeg_count"`
	OfaCount            uint32      `json:"ofa_count"`
	Placements          []placement `json:"placements"`
	ComputeProfiles     []ciProfile `json:"compute_instance_profiles"`
}

type gpu struct {
	Mock            string      `json:"mock"`
	Count           int         `json:"count"`
	Name            string      `json:"name"`
	PciDeviceID     string      `json:"pci_device_id"`
	MemoryTotalMB   uint64      `json:"memory_total_mb"`
	GpuInstanceInfo []giProfile `json:"gpu_instance_profiles"`
}

func check(ret nvml.Return, what string) {
	if ret != nvml.SUCCESS {
		fmt.Fprintf(os.Stderr, "nvml-mig-mocks: %s: %v\n", what, ret)
		os.Exit(1)
	}
}

func describe(mock string, lib nvml.Interface) gpu {
	check(lib.Init(), mock+" Init")
	count, ret := lib.DeviceGetCount()
	check(ret, mock+" DeviceGetCount")
	device, ret := lib.DeviceGetHandleByIndex(0)
	check(ret, mock+" DeviceGetHandleByIndex(0)")
	name, ret := device.GetName()
	check(ret, mock+" GetName")
	pci, ret := device.GetPciInfo()
	check(ret, mock+" GetPciInfo")
	memory, ret := device.GetMemoryInfo()
	check(ret, mock+" GetMemoryInfo")
	out := gpu{Mock: mock, Count: count, Name: name, PciDeviceID: fmt.Sprintf("0x%08X", pci.PciDeviceId),
		MemoryTotalMB: memory.Total / (1024 * 1024), GpuInstanceInfo: []giProfile{}}
	for profile := 0; profile < nvml.GPU_INSTANCE_PROFILE_COUNT; profile++ {
		info, ret := device.GetGpuInstanceProfileInfo(profile)
		if ret == nvml.ERROR_NOT_SUPPORTED {
			continue
		}
		check(ret, fmt.Sprintf("%s GetGpuInstanceProfileInfo(%d)", mock, profile))
		entry := giProfile{Profile: profile, ProfileName: giProfileNames[profile], ID: info.Id,
			SliceCount: info.SliceCount, InstanceCount: info.InstanceCount, MemorySizeMB: info.MemorySizeMB,
			MultiprocessorCount: info.MultiprocessorCount, CopyEngineCount: info.CopyEngineCount,
			DecoderCount: info.DecoderCount, EncoderCount: info.EncoderCount, JpegCount: info.JpegCount,
			OfaCount: info.OfaCount, Placements: []placement{}, ComputeProfiles: []ciProfile{}}
		placements, ret := device.GetGpuInstancePossiblePlacements(&info)
		check(ret, fmt.Sprintf("%s GetGpuInstancePossiblePlacements(%d)", mock, profile))
		for _, p := range placements {
			entry.Placements = append(entry.Placements, placement{p.Start, p.Size})
		}
		instance, ret := device.CreateGpuInstance(&info)
		check(ret, fmt.Sprintf("%s CreateGpuInstance(%d)", mock, profile))
		for ci := 0; ci < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; ci++ {
			ciInfo, ret := instance.GetComputeInstanceProfileInfo(ci, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
			if ret == nvml.ERROR_NOT_SUPPORTED {
				continue
			}
			check(ret, fmt.Sprintf("%s GetComputeInstanceProfileInfo(%d, %d)", mock, profile, ci))
			ciEntry := ciProfile{Profile: ci, SliceCount: ciInfo.SliceCount, InstanceCount: ciInfo.InstanceCount,
				MultiprocessorCount: ciInfo.MultiprocessorCount, Placements: []placement{}}
			ciPlacements, ret := instance.GetComputeInstancePossiblePlacements(&ciInfo)
			check(ret, fmt.Sprintf("%s GetComputeInstancePossiblePlacements(%d, %d)", mock, profile, ci))
			for _, p := range ciPlacements {
				ciEntry.Placements = append(ciEntry.Placements, placement{p.Start, p.Size})
			}
			entry.ComputeProfiles = append(entry.ComputeProfiles, ciEntry)
		}
		check(instance.Destroy(), fmt.Sprintf("%s GpuInstance.Destroy(%d)", mock, profile))
		out.GpuInstanceInfo = append(out.GpuInstanceInfo, entry)
	}
	check(lib.Shutdown(), mock+" Shutdown")
	return out
}

func main() {
	result := []gpu{
		describe("dgxa100", dgxa100.New()),
		describe("dgxh100", dgxh100.New()),
		describe("dgxh200", dgxh200.New()),
		describe("dgxb200", dgxb200.New()),
	}
	encoder := json.NewEncoder(os.Stdout)
	encoder.SetIndent("", "  ")
	if err := encoder.Encode(map[string]any{"schema": 1, "gpus": result}); err != nil {
		fmt.Fprintf(os.Stderr, "nvml-mig-mocks: %v\n", err)
		os.Exit(1)
	}
}
