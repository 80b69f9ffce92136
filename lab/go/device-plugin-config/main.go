// Command device-plugin-config-check reads NVIDIA device plugin config files with the plugin's own loader
// (github.com/NVIDIA/k8s-device-plugin api/config/v1, pinned in go.mod) and says, per file, whether the plugin would
// start with it: the project's tests run it as the oracle for plugins/module_utils/device_plugin_config.py.
//
// Usage: device-plugin-config-check FILE...
//
// One JSON line per file: {"file": ..., "accepted": true|false, "error": "...", "warnings": [...]}. Exit status 0
// when every file was read (accepted or not), 2 on a usage error.
//
// What runs per file is what the plugin's startPlugins runs before it touches a GPU: spec.NewConfig (parse, version,
// unmarshal with every UnmarshalJSON check of replicas, devices, names and renames; command-line flags and their
// environment variables layered on top), then spec.DisableResourceNamingInConfig (its warnings are reported: the
// plugin ignores what they name), then the plugin's validateFlags. validateFlags lives in the plugin's main package,
// which cannot be imported, so it is restated below from v0.18.0's cmd/nvidia-device-plugin/main.go, leaving out its
// one check that needs NVML (CDI device-list strategies need an NVML-based system). The flags below are the plugin's
// own names, defaults and environment variables, so an environment such as the Helm chart's MPS_ROOT applies the same.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	spec "github.com/NVIDIA/k8s-device-plugin/api/config/v1"
	cli "github.com/urfave/cli/v2"
	"k8s.io/klog/v2"
)

type verdict struct {
	File     string   `json:"file"`
	Accepted bool     `json:"accepted"`
	Error    string   `json:"error,omitempty"`
	Warnings []string `json:"warnings"`
}

// pluginFlags are the flags of the plugin's command (v0.18.0) that spec.NewConfig and validateFlags read.
func pluginFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "mig-strategy", Value: spec.MigStrategyNone, EnvVars: []string{"MIG_STRATEGY"}},
		&cli.BoolFlag{Name: "fail-on-init-error", Value: true, EnvVars: []string{"FAIL_ON_INIT_ERROR"}},
		&cli.StringFlag{Name: "driver-root", Aliases: []string{"nvidia-driver-root"}, Value: "/",
			EnvVars: []string{"NVIDIA_DRIVER_ROOT"}},
		&cli.StringFlag{Name: "dev-root", Aliases: []string{"nvidia-dev-root"}, EnvVars: []string{"NVIDIA_DEV_ROOT"}},
		&cli.BoolFlag{Name: "pass-device-specs", EnvVars: []string{"PASS_DEVICE_SPECS"}},
		&cli.StringSliceFlag{Name: "device-list-strategy", Value: cli.NewStringSlice(spec.DeviceListStrategyEnvVar),
			EnvVars: []string{"DEVICE_LIST_STRATEGY"}},
		&cli.StringFlag{Name: "device-id-strategy", Value: spec.DeviceIDStrategyUUID,
			EnvVars: []string{"DEVICE_ID_STRATEGY"}},
		&cli.BoolFlag{Name: "gdrcopy-enabled", EnvVars: []string{"GDRCOPY_ENABLED"}},
		&cli.BoolFlag{Name: "gds-enabled", EnvVars: []string{"GDS_ENABLED"}},
		&cli.BoolFlag{Name: "mofed-enabled", EnvVars: []string{"MOFED_ENABLED"}},
		&cli.StringFlag{Name: "config-file", EnvVars: []string{"CONFIG_FILE"}},
		&cli.StringFlag{Name: "cdi-annotation-prefix", Value: spec.DefaultCDIAnnotationPrefix,
			EnvVars: []string{"CDI_ANNOTATION_PREFIX"}},
		&cli.StringFlag{Name: "nvidia-cdi-hook-path", Aliases: []string{"nvidia-ctk-path"},
			Value: spec.DefaultNvidiaCTKPath, EnvVars: []string{"NVIDIA_CDI_HOOK_PATH", "NVIDIA_CTK_PATH"}},
		&cli.StringFlag{Name: "driver-root-ctr-path", Aliases: []string{"container-driver-root"},
			Value: spec.DefaultContainerDriverRoot, EnvVars: []string{"DRIVER_ROOT_CTR_PATH", "CONTAINER_DRIVER_ROOT"}},
		&cli.StringFlag{Name: "mps-root", EnvVars: []string{"MPS_ROOT"}},
		&cli.StringFlag{Name: "device-discovery-strategy", Value: "auto", EnvVars: []string{"DEVICE_DISCOVERY_STRATEGY"}},
		&cli.IntSliceFlag{Name: "imex-channel-ids", EnvVars: []string{"IMEX_CHANNEL_IDS"}},
		&cli.BoolFlag{Name: "imex-required", EnvVars: []string{"IMEX_REQUIRED"}},
	}
}

// validateFlags: the plugin's own checks after loading, less the NVML-only CDI check (see the package comment).
func validateFlags(config *spec.Config) error {
	if _, err := spec.NewDeviceListStrategies(*config.Flags.Plugin.DeviceListStrategy); err != nil {
		return fmt.Errorf("invalid --device-list-strategy option: %v", err)
	}
	if id := *config.Flags.Plugin.DeviceIDStrategy; id != spec.DeviceIDStrategyUUID && id != spec.DeviceIDStrategyIndex {
		return fmt.Errorf("invalid --device-id-strategy option: %v", id)
	}
	if config.Sharing.SharingStrategy() == spec.SharingStrategyMPS {
		if *config.Flags.MigStrategy == spec.MigStrategyMixed {
			return fmt.Errorf("using --mig-strategy=mixed is not supported with MPS")
		}
		if config.Flags.MpsRoot == nil || *config.Flags.MpsRoot == "" {
			return fmt.Errorf("using MPS requires --mps-root to be specified")
		}
	}
	switch *config.Flags.DeviceDiscoveryStrategy {
	case "auto", "nvml", "tegra":
	default:
		return fmt.Errorf("invalid --device-discovery-strategy option %v", *config.Flags.DeviceDiscoveryStrategy)
	}
	switch *config.Flags.MigStrategy {
	case spec.MigStrategyNone, spec.MigStrategySingle, spec.MigStrategyMixed:
	default:
		return fmt.Errorf("unknown MIG strategy: %v", *config.Flags.MigStrategy)
	}
	if err := spec.AssertChannelIDsValid(config.Imex.ChannelIDs); err != nil {
		return fmt.Errorf("invalid IMEX channel IDs: %w", err)
	}
	return nil
}

func check(file string, warnings *bytes.Buffer) verdict {
	warnings.Reset()
	result := verdict{File: file, Warnings: []string{}}
	app := cli.NewApp()
	app.Flags = pluginFlags()
	app.HideHelp = true
	app.Action = func(c *cli.Context) error {
		config, err := spec.NewConfig(c, app.Flags)
		if err != nil {
			return fmt.Errorf("unable to load config: unable to finalize config: %v", err)
		}
		config.Flags.GFD = nil
		spec.DisableResourceNamingInConfig(config)
		if err := validateFlags(config); err != nil {
			return fmt.Errorf("unable to validate flags: %v", err)
		}
		return nil
	}
	if err := app.Run([]string{"nvidia-device-plugin", "--config-file", file}); err != nil {
		result.Error = err.Error()
	} else {
		result.Accepted = true
	}
	klog.Flush()
	for _, line := range strings.Split(strings.TrimSpace(warnings.String()), "\n") {
		if line != "" {
			// klog's header (severity, time, file:line) carries nothing a test should compare.
			if _, message, found := strings.Cut(line, "] "); found {
				line = message
			}
			result.Warnings = append(result.Warnings, line)
		}
	}
	return result
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: device-plugin-config-check FILE...")
		os.Exit(2)
	}
	var warnings bytes.Buffer
	klog.LogToStderr(false)
	// A warning would reach both the WARNING and the INFO writer; the plugin's warnings are what the tests read.
	klog.SetOutputBySeverity("INFO", io.Discard)
	klog.SetOutputBySeverity("WARNING", &warnings)
	out := json.NewEncoder(os.Stdout)
	for _, file := range os.Args[1:] {
		if err := out.Encode(check(file, &warnings)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
