package composecheck

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// The Dockerfile copies every module's go.mod before `go mod graph`: a
// go.work module missing there makes the workspace fail to load, and the
// image (docker-compose's onceflow:dev) fails to build. No Docker engine
// runs here, so this test is what keeps the list in step with go.work.
func TestDockerfileCopiesEveryWorkspaceModule(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	work, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		t.Fatal(err)
	}
	docker, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	copied := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^COPY (\S+)/go\.mod `).FindAllStringSubmatch(string(docker), -1) {
		copied[m[1]] = true
	}
	modules := regexp.MustCompile(`(?m)^\s+\./(\S+)$`).FindAllStringSubmatch(string(work), -1)
	if len(modules) == 0 {
		t.Fatal("found no modules in go.work's use block")
	}
	for _, m := range modules {
		if !copied[m[1]] {
			t.Errorf("go.work uses ./%s, but the Dockerfile does not COPY %s/go.mod (add: COPY %s/go.mod %s/go.sum ./%s/)", m[1], m[1], m[1], m[1], m[1])
		}
	}
}
