package schema

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// File is the text of one schema file of a folder, as a schema registry
// takes it.
type File struct {
	Key Key
	// Name is the file relative to the folder, slash-separated
	// (order.created/v1.avsc), for errors.
	Name string
	Text []byte
}

// Avro schemas sit beside the JSON Schemas: order.created/v1.avsc is the
// Avro form of order.created/v1.json.
var avroFile = regexp.MustCompile(`^v([1-9][0-9]{0,8})\.avsc$`)

// Files reads the schema files of dir with the extension ext, "json" for
// the JSON Schemas Load compiles or "avsc" for their Avro forms, by event
// type and version. It checks names as Load does (a misnamed file is one
// error naming it) but not contents: that is for the caller that parses
// them.
func Files(dir, ext string) (map[Key]File, error) {
	out := map[Key]File{}
	if ext == "json" {
		files, err := list(dir)
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			text, err := os.ReadFile(f.path)
			if err != nil {
				return nil, fmt.Errorf("read schema %s: %w", f.rel, err)
			}
			out[f.key] = File{Key: f.key, Name: f.rel, Text: text}
		}
		return out, nil
	}
	if ext != "avsc" {
		return nil, fmt.Errorf("schema files: extension %q is not json or avsc", ext)
	}
	types, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read schema folder: %w", err)
	}
	for _, t := range types {
		if !t.IsDir() || strings.HasPrefix(t.Name(), "_") || strings.HasPrefix(t.Name(), ".") {
			continue
		}
		entries, err := os.ReadDir(filepath.Join(dir, t.Name()))
		if err != nil {
			return nil, fmt.Errorf("read schema folder: %w", err)
		}
		for _, e := range entries {
			if e.IsDir() || !strings.EqualFold(filepath.Ext(e.Name()), ".avsc") {
				continue
			}
			rel := t.Name() + "/" + e.Name()
			m := avroFile.FindStringSubmatch(e.Name())
			if m == nil {
				return nil, fmt.Errorf("avro schema file %s is not named v<version>.avsc; rename it (v1.avsc, v2.avsc, ...)", rel)
			}
			n, _ := strconv.Atoi(m[1])
			text, err := os.ReadFile(filepath.Join(dir, t.Name(), e.Name()))
			if err != nil {
				return nil, fmt.Errorf("read schema %s: %w", rel, err)
			}
			k := Key{t.Name(), n}
			out[k] = File{Key: k, Name: rel, Text: text}
		}
	}
	return out, nil
}
