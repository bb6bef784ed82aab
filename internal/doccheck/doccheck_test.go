package doccheck

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/outboxrelay/outboxrelay/internal/config"
)

// root is the repository, seen from this package's directory.
const root = "../.."

// modulePath is the main module's path; the outbox and inbox modules,
// nested in it, have paths under it.
const modulePath = "github.com/outboxrelay/outboxrelay"

// pages are the documentation files the test reads.
func pages(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) == 0 {
		t.Fatalf("no docs/*.md under %s", root)
	}
	files := []string{"README.md", "ARCHITECTURE.md"}
	for _, d := range docs {
		files = append(files, filepath.ToSlash(strings.TrimPrefix(d, root+string(filepath.Separator))))
	}
	return files
}

var (
	// importRE finds Go import paths of this repository's modules; an
	// @version or /... suffix is not part of the path.
	importRE = regexp.MustCompile(regexp.QuoteMeta(modulePath) + `(/[A-Za-z0-9_./-]*[A-Za-z0-9_])?`)
	// pathRE finds repository paths: a word starting with one of the
	// top-level directories, as in sinks/kafka/txn.go:221, internal/backoff
	// or cmd/outboxrelay/. What comes before it must not be part of a
	// longer word or path (a URL, /usr/lib/..., github.com/...).
	pathRE = regexp.MustCompile(`(^|[^A-Za-z0-9_./:@-])((?:\.ci|bench|cdc|cmd|deploy|docs|envelope|examples|inbox|integration|internal|migrations|outbox|relay|replay|sinks|verify)/[A-Za-z0-9_./*-]*)`)
	// linkRE finds Markdown links and their targets.
	linkRE = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// headingRE finds Markdown headings, outside code blocks.
	headingRE = regexp.MustCompile(`^#{1,6} (.*)$`)
)

// ref is one name a page gives: the page and line it is on.
type ref struct {
	page string
	line int
	name string
}

func (r ref) String() string { return fmt.Sprintf("%s:%d: %s", r.page, r.line, r.name) }

// lines returns the page's lines.
func lines(t *testing.T, page string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, page))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(string(b), "\n")
}

// repoPaths returns the repository paths the page names, with a line
// number suffix (:221) or a trailing dot or slash taken off.
func repoPaths(page string, text []string) []ref {
	var refs []ref
	for n, l := range text {
		for _, m := range pathRE.FindAllStringSubmatch(l, -1) {
			p := m[2]
			if i := strings.Index(p, ":"); i >= 0 {
				p = p[:i]
			}
			p = strings.TrimRight(p, ".")
			refs = append(refs, ref{page, n + 1, p})
		}
	}
	return refs
}

// exists reports whether a repository path, possibly a glob, names a file
// or directory.
func exists(p string) bool {
	full := filepath.Join(root, filepath.FromSlash(strings.TrimSuffix(p, "/")))
	if strings.ContainsAny(p, "*?[") {
		m, err := filepath.Glob(full)
		return err == nil && len(m) > 0
	}
	_, err := os.Stat(full)
	return err == nil
}

// importProblem says what is wrong with an import path of the repository's
// modules: its directory holds no Go package, or it is internal, which no
// service can import. Empty when it is a package a service can import.
func importProblem(imp string) string {
	rel := strings.TrimPrefix(strings.TrimPrefix(imp, modulePath), "/")
	if rel == "" {
		return "" // the module itself, as in go install or go get
	}
	if slices.Contains(strings.Split(rel, "/"), "internal") {
		return "is internal: no service can import it"
	}
	dir := filepath.Join(root, filepath.FromSlash(rel))
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "has no directory in the repository"
	}
	for _, e := range entries {
		if n := e.Name(); !e.IsDir() && strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") {
			return ""
		}
	}
	return "is a directory without a Go package"
}

// slug is the anchor GitHub gives a heading.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the anchors of a page's headings, code blocks skipped.
func anchors(text []string) map[string]bool {
	a := map[string]bool{}
	fence := false
	for _, l := range text {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fence = !fence
			continue
		}
		if m := headingRE.FindStringSubmatch(l); m != nil && !fence {
			a[slug(m[1])] = true
		}
	}
	return a
}

// TestDocumentedNamesExist fails on a repository path, a relative link (its
// anchor included) or an import path of the repository's modules that the
// documentation names and that does not exist.
func TestDocumentedNamesExist(t *testing.T) {
	texts := map[string][]string{}
	for _, p := range pages(t) {
		texts[p] = lines(t, p)
	}
	checked := 0
	for page, text := range texts {
		for _, r := range repoPaths(page, text) {
			checked++
			if !exists(r.name) {
				t.Errorf("%v: no such file or directory in the repository", r)
			}
		}
		for n, l := range text {
			for _, m := range importRE.FindAllString(l, -1) {
				checked++
				if problem := importProblem(m); problem != "" {
					t.Errorf("%v: import path %s", ref{page, n + 1, m}, problem)
				}
			}
			for _, m := range linkRE.FindAllStringSubmatch(l, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				file, anchor, _ := strings.Cut(target, "#")
				dest := page
				if file != "" {
					dest = path.Join(path.Dir(page), file)
					if !exists(dest) {
						t.Errorf("%v: the link's file %s does not exist", ref{page, n + 1, target}, dest)
						continue
					}
				}
				if anchor == "" {
					continue
				}
				destText, ok := texts[dest]
				if !ok {
					if !strings.HasSuffix(dest, ".md") {
						continue
					}
					destText = lines(t, dest)
				}
				if !anchors(destText)[anchor] {
					t.Errorf("%v: %s has no heading with the anchor #%s", ref{page, n + 1, target}, dest, anchor)
				}
			}
		}
	}
	// The pages name hundreds of paths; a pattern that stopped matching
	// would pass every page unchecked.
	if checked < 100 {
		t.Fatalf("checked only %d names in %d pages; the patterns no longer find them", checked, len(texts))
	}
	t.Logf("checked %d names in %d pages", checked, len(texts))
}

// TestReadmeConfigExample loads the README's ten-line configuration, the
// block after <!-- config-example -->, as the relay would: a key renamed
// or removed fails here.
func TestReadmeConfigExample(t *testing.T) {
	text := strings.Join(lines(t, "README.md"), "\n")
	const marker = "<!-- config-example -->\n```yaml\n"
	i := strings.Index(text, marker)
	if i < 0 {
		t.Fatalf("README.md has no %q block", marker)
	}
	block, _, ok := strings.Cut(text[i+len(marker):], "\n```")
	if !ok {
		t.Fatal("README.md: the config example's code block does not end")
	}
	file := filepath.Join(t.TempDir(), "outboxrelay.yaml")
	if err := os.WriteFile(file, []byte(block+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(file, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatalf("the README's config example does not load:\n%v", err)
	}
	if cfg.Sink.Type != "kafka" {
		t.Errorf("the README's config example loads with sink.type %q, want kafka", cfg.Sink.Type)
	}
}
