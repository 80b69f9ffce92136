// Command cdi-validate is the CDI oracle of the gpu-lab tests: it reads each CDI spec file named on its command line
// with the CNCF container-device-interface module's own loader (pkg/cdi.ReadSpec: strict YAML/JSON decoding, the
// cdiVersion against the features the spec uses, the kind's vendor and class, annotations, container edits, device
// names) and prints one JSON line per file: {"path", "valid", "kind", "devices", "error"}. Exit status 1 when a
// file is refused, 2 on usage errors.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"tags.cncf.io/container-device-interface/pkg/cdi"
)

type verdict struct {
	Path    string   `json:"path"`
	Valid   bool     `json:"valid"`
	Kind    string   `json:"kind,omitempty"`
	Devices []string `json:"devices,omitempty"`
	Error   string   `json:"error,omitempty"`
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: cdi-validate SPEC_FILE...")
		os.Exit(2)
	}
	out := json.NewEncoder(os.Stdout)
	refused := false
	for _, path := range os.Args[1:] {
		result := verdict{Path: path}
		spec, err := cdi.ReadSpec(path, 0)
		if err != nil {
			result.Error = err.Error()
			refused = true
		} else {
			result.Valid = true
			result.Kind = spec.Kind
			for _, device := range spec.Devices {
				result.Devices = append(result.Devices, device.Name)
			}
		}
		if err := out.Encode(result); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	if refused {
		os.Exit(1)
	}
}
