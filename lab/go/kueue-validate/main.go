// Command kueue-validate is the Kueue oracle of the gpu-lab tests: it reads ClusterQueue objects (YAML or JSON, one or
// more documents per input, from the files named on its command line or from stdin) and runs on each the validation
// Kueue's own admission webhook runs on a ClusterQueue's create and update (sigs.k8s.io/kueue pkg/webhooks,
// ValidateClusterQueue, of the release go.mod pins). It prints one JSON line per ClusterQueue:
// {"name", "valid", "errors": [{"field", "type", "value", "detail"}], "error"}, where "error" is a decoding error (a
// value that is not a quantity, a wrong type): what the API server itself would refuse before any webhook is called.
// Documents of other kinds are skipped. Exit status 1 when an object is refused, 2 on usage or read errors.
//
// Usage: kueue-validate [FILE...]   (no FILE, or "-": stdin)
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	"sigs.k8s.io/kueue/pkg/webhooks"
)

type fieldError struct {
	Field  string `json:"field"`
	Type   string `json:"type"`
	Value  string `json:"value"`
	Detail string `json:"detail"`
}

type verdict struct {
	Source string       `json:"source"`
	Name   string       `json:"name"`
	Valid  bool         `json:"valid"`
	Errors []fieldError `json:"errors,omitempty"`
	Error  string       `json:"error,omitempty"`
}

// judge decodes one document (already JSON) as a ClusterQueue and runs the webhook's validation on it.
func judge(source string, document []byte) (verdict, bool) {
	var head struct {
		Kind     string `json:"kind"`
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(document, &head); err != nil || head.Kind != "ClusterQueue" {
		return verdict{}, false
	}
	result := verdict{Source: source, Name: head.Metadata.Name}
	var queue kueue.ClusterQueue
	if err := json.Unmarshal(document, &queue); err != nil {
		result.Error = err.Error()
		return result, true
	}
	for _, problem := range webhooks.ValidateClusterQueue(&queue) {
		result.Errors = append(result.Errors, fieldError{Field: problem.Field, Type: string(problem.Type),
			Value: fmt.Sprint(problem.BadValue), Detail: problem.Detail})
	}
	result.Valid = len(result.Errors) == 0
	return result, true
}

func read(source string, input io.Reader, out *json.Encoder) (refused bool, err error) {
	decoder := utilyaml.NewYAMLOrJSONDecoder(bufio.NewReader(input), 4096)
	for {
		var document json.RawMessage
		if err := decoder.Decode(&document); err != nil {
			if errors.Is(err, io.EOF) {
				return refused, nil
			}
			return refused, fmt.Errorf("%s: %w", source, err)
		}
		if len(document) == 0 || string(document) == "null" {
			continue
		}
		result, isQueue := judge(source, document)
		if !isQueue {
			continue
		}
		refused = refused || !result.Valid
		if err := out.Encode(result); err != nil {
			return refused, err
		}
	}
}

func main() {
	sources := os.Args[1:]
	if len(sources) == 0 {
		sources = []string{"-"}
	}
	out := json.NewEncoder(os.Stdout)
	out.SetEscapeHTML(false)
	refused := false
	for _, source := range sources {
		var input io.Reader = os.Stdin
		if source != "-" {
			file, err := os.Open(source)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(2)
			}
			defer file.Close()
			input = file
		}
		fileRefused, err := read(source, input, out)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		refused = refused || fileRefused
	}
	if refused {
		os.Exit(1)
	}
}
