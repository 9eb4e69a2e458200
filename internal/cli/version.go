package cli

import (
	"fmt"
	"regexp"
	"runtime"
	"runtime/debug"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/pgquota/pgquota/migrations"
)

// Version is the release of pgquota this source tree is, and the one place
// it is written down: CHANGELOG.md has a section for it, and the README's
// go install line names it (TestVersionIsPinnedInChangelogAndReadme). A
// release bumps it, adds the CHANGELOG section and tags the commit with it.
const Version = "v0.2.0"

// develSuffix marks a build that is not the tagged release itself: one
// from a clone (go build, go run, go test) or from a commit between tags.
const develSuffix = "+devel"

// pseudoVersion matches the timestamp and commit hash that end the
// version of a pseudo-version (v0.0.0-20261202080312-3e348de1a2b3,
// v0.1.1-0.20261202080312-3e348de1a2b3): a build of an untagged commit.
var pseudoVersion = regexp.MustCompile(`[-.]\d{14}-[0-9a-f]{12}(\+|$)`)

// releaseVersion matches a tagged module version as go install ...@vX.Y.Z
// records it: vMAJOR.MINOR.PATCH with an optional pre-release, without
// build metadata (go build in a modified checkout adds "+dirty").
var releaseVersion = regexp.MustCompile(`^v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$`)

// versionFrom is the version a binary reports, given the main module's
// version from its build info: that version when it is a tagged release
// (go install github.com/pgquota/pgquota/cmd/pgquota@v0.1.0 records
// "v0.1.0"), else Version with develSuffix ("v0.1.0+devel"): for "(devel)"
// or "" (go run, go test, go build outside a VCS checkout), a
// pseudo-version (an untagged commit) or a version with build metadata
// (a modified checkout, "+dirty").
func versionFrom(mainVersion string) string {
	if releaseVersion.MatchString(mainVersion) && !pseudoVersion.MatchString(mainVersion) {
		return mainVersion
	}
	return Version + develSuffix
}

// buildVersion is the version this binary reports (versionFrom of its
// build info's main module version).
func buildVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return versionFrom("")
	}
	return versionFrom(info.Main.Version)
}

// versionInfo is what `pgquota version` prints.
type versionInfo struct {
	// Version is the release ("v0.1.0"), or Version+"+devel" for a build
	// that is not a tagged release (versionFrom).
	Version string `json:"version"`
	Go      string `json:"go_version"`
	// Schema is the migration version this build needs (migrations.Latest).
	Schema int64 `json:"schema_version"`
}

func currentVersion() versionInfo {
	return versionInfo{Version: buildVersion(), Go: runtime.Version(), Schema: migrations.Latest()}
}

// versionLine is --version's output.
func versionLine() string {
	v := currentVersion()
	return fmt.Sprintf("pgquota %s (%s), needs schema version %d\n", v.Version, v.Go, v.Schema)
}

func (a *app) versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print pgquota's version and the schema (migration) version it needs",
		Long: `Print the version of this pgquota build and the migration version it
needs. A build of a tagged release (go install
github.com/pgquota/pgquota/cmd/pgquota@` + Version + `) prints that release;
any other build (go run or go build in a clone, an untagged commit, a
modified checkout) prints the version of its source with "` + develSuffix + `"
(` + Version + develSuffix + `). It does not connect: 'pgquota migrate version'
prints the database's.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			v := currentVersion()
			return a.output(v, func(w *tabwriter.Writer) {
				row(w, "pgquota", v.Version)
				row(w, "go", v.Go)
				row(w, "schema version", fmt.Sprintf("%d (the migration this build needs; pgquota migrate version shows the database's)", v.Schema))
			})
		},
	}
}
