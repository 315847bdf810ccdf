package server

import (
	"context"
	"encoding/xml"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// h2specNotApplicable are the h2spec cases a gRPC server does not pass, by
// "section/number: description" as h2spec names them, with the reason; they
// are listed in docs/security.md too. Every other case must pass.
var h2specNotApplicable = map[string]map[string]string{
	TransportLean: {
		"generic/2: Sends a PRIORITY frame on half-closed (remote) stream":                                                                                      "expects a response with DATA; a GET is answered 405 trailers-only (no DATA), as grpc-go answers",
		"generic/2: Sends a WINDOW_UPDATE frame on half-closed (remote) stream":                                                                                 "expects a response with DATA; a GET is answered 405 trailers-only (no DATA), as grpc-go answers",
		"http2/5.1.2: Sends HEADERS frames that causes their advertised concurrent stream limit to be exceeded":                                                 "h2spec's GET requests are answered (405) as their HEADERS arrive, so they never count against the limit; gRPC calls over it are refused (TestRawProtocol)",
		"http2/6.9.1: Sends multiple WINDOW_UPDATE frames increasing the flow control window to above 2^31-1 on a stream":                                       "the non-gRPC request is answered and its stream closed before the WINDOW_UPDATEs; on an open stream the overflow is a FLOW_CONTROL_ERROR stream error",
		"http2/8.1.2.6: Sends a HEADERS frame with the \"content-length\" header field which does not equal the DATA frame payload length":                      "the request has no application/grpc content-type: answered 415 at its HEADERS, before the DATA, as grpc-go does; a gRPC request whose content-length differs is reset with PROTOCOL_ERROR (TestContentLength)",
		"http2/8.1.2.6: Sends a HEADERS frame with the \"content-length\" header field which does not equal the sum of the multiple DATA frames payload length": "as above: answered 415 before the DATA; checked for gRPC requests (TestContentLength)",
		"skipped http2/6.5.3: Sends multiple values of SETTINGS_INITIAL_WINDOW_SIZE":                                                                            "h2spec needs an answer with a DATA body; non-gRPC requests get trailers-only answers",
		"skipped http2/6.9.1: Sends SETTINGS frame to set the initial window size to 1 and sends HEADERS frame":                                                 "h2spec needs an answer with a DATA body; flow control of gRPC answers is tested in TestLargeAnswerWaitsForFlowControl",
		"skipped http2/6.9.2: Changes SETTINGS_INITIAL_WINDOW_SIZE after sending HEADERS frame":                                                                 "h2spec needs an answer with a DATA body",
		"skipped http2/6.9.2: Sends a SETTINGS frame for window size to be negative":                                                                            "h2spec needs an answer with a DATA body",
	},
	TransportGRPCGo: {
		"generic/2: Sends a PRIORITY frame on half-closed (remote) stream":                                                                                      "expects a response with DATA; a GET is answered 405 trailers-only (no DATA), as grpc-go answers",
		"generic/2: Sends a WINDOW_UPDATE frame on half-closed (remote) stream":                                                                                 "expects a response with DATA; a GET is answered 405 trailers-only (no DATA), as grpc-go answers",
		"http2/3.5: Sends invalid connection preface":                                                                                                           "grpc-go's server is lenient here (the reference's server too): the reason to keep the lean transport the default",
		"http2/5.1.2: Sends HEADERS frames that causes their advertised concurrent stream limit to be exceeded":                                                 "h2spec's GET requests are answered (405) as their HEADERS arrive, so they never count against the limit; gRPC calls over it are refused (TestRawProtocol)",
		"http2/5.1: closed: Sends a DATA frame":                                                                                                                 "grpc-go's server is lenient here (the reference's server too): the reason to keep the lean transport the default",
		"http2/5.1: closed: Sends a DATA frame after sending RST_STREAM frame":                                                                                  "grpc-go's server is lenient here (the reference's server too): the reason to keep the lean transport the default",
		"http2/5.1: half closed (remote): Sends a DATA frame":                                                                                                   "grpc-go's server is lenient here (the reference's server too): the reason to keep the lean transport the default",
		"http2/5.1: idle: Sends a DATA frame":                                                                                                                   "grpc-go's server is lenient here (the reference's server too): the reason to keep the lean transport the default",
		"http2/5.1: idle: Sends a RST_STREAM frame":                                                                                                             "grpc-go's server is lenient here (the reference's server too): the reason to keep the lean transport the default",
		"http2/5.1: idle: Sends a WINDOW_UPDATE frame":                                                                                                          "grpc-go's server is lenient here (the reference's server too): the reason to keep the lean transport the default",
		"http2/5.3.1: Sends HEADERS frame that depend on itself":                                                                                                "grpc-go's server is lenient here (the reference's server too): the reason to keep the lean transport the default",
		"http2/5.3.1: Sends PRIORITY frame that depend on itself":                                                                                               "grpc-go's server is lenient here (the reference's server too): the reason to keep the lean transport the default",
		"http2/5.4.1: Sends an invalid PING frame to receive GOAWAY frame":                                                                                      "grpc-go's server is lenient here (the reference's server too): the reason to keep the lean transport the default",
		"http2/6.10: Sends a CONTINUATION frame preceded by a DATA frame":                                                                                       "grpc-go answers this one inconsistently (passed in one CI run here, failed twice in a row in the next, under -race): upstream grpc-go behaviour, not ours; lean passes it",
		"http2/4.3: Sends a PRIORITY frame while sending the header blocks":                                                                                     "grpc-go answers this one inconsistently too (failed in a CI=true run beside a CPU hog under -race, twice in a row, 2026-12-01; passed in the runs before): upstream grpc-go behaviour, the same class as 6.10 and 6.2; lean passes it",
		"http2/4.3: Sends a HEADERS frame to another stream while sending the header blocks":                                                                    "the same family as the three above (a header block interrupted by another frame), answered inconsistently by grpc-go: failed twice in a row in a CI=true run beside a CPU hog under -race, 2026-12-01, passed in the five runs before and in a rerun beside a hog; upstream behaviour; lean passes it",
		"http2/6.2: Sends a HEADERS frame without the END_HEADERS flag, and a PRIORITY frame":                                                                   "grpc-go answers this one inconsistently (passed in one CI run here, failed twice in a row in the next, under -race): upstream grpc-go behaviour, not ours; lean passes it",
		"http2/6.1: Sends a DATA frame on the stream that is not in \"open\" or \"half-closed (local)\" state":                                                  "grpc-go's server is lenient here (the reference's server too): the reason to keep the lean transport the default",
		"http2/6.4: Sends a RST_STREAM frame on a idle stream":                                                                                                  "grpc-go's server is lenient here (the reference's server too): the reason to keep the lean transport the default",
		"http2/6.5.2: SETTINGS_ENABLE_PUSH (0x2): Sends the value other than 0 or 1":                                                                            "grpc-go's server is lenient here (the reference's server too): the reason to keep the lean transport the default",
		"http2/6.5.2: SETTINGS_MAX_FRAME_SIZE (0x5): Sends the value above the maximum allowed frame size":                                                      "grpc-go's server is lenient here (the reference's server too): the reason to keep the lean transport the default",
		"http2/6.5.2: SETTINGS_MAX_FRAME_SIZE (0x5): Sends the value below the initial value":                                                                   "grpc-go's server is lenient here (the reference's server too): the reason to keep the lean transport the default",
		"http2/6.9.1: Sends multiple WINDOW_UPDATE frames increasing the flow control window to above 2^31-1":                                                   "grpc-go's server is lenient here (the reference's server too): the reason to keep the lean transport the default",
		"http2/6.9.1: Sends multiple WINDOW_UPDATE frames increasing the flow control window to above 2^31-1 on a stream":                                       "the non-gRPC request is answered and its stream closed before the WINDOW_UPDATEs; on an open stream the overflow is a FLOW_CONTROL_ERROR stream error",
		"http2/8.1.2.2: Sends a HEADERS frame that contains the TE header field with any value other than \"trailers\"":                                         "grpc-go's server is lenient here (the reference's server too): the reason to keep the lean transport the default",
		"http2/8.1.2.3: Sends a HEADERS frame that omits \":method\" pseudo-header field":                                                                       "grpc-go's server is lenient here (the reference's server too): the reason to keep the lean transport the default",
		"http2/8.1.2.3: Sends a HEADERS frame that omits \":path\" pseudo-header field":                                                                         "grpc-go's server is lenient here (the reference's server too): the reason to keep the lean transport the default",
		"http2/8.1.2.3: Sends a HEADERS frame that omits \":scheme\" pseudo-header field":                                                                       "grpc-go's server is lenient here (the reference's server too): the reason to keep the lean transport the default",
		"http2/8.1.2.3: Sends a HEADERS frame with empty \":path\" pseudo-header field":                                                                         "grpc-go's server is lenient here (the reference's server too): the reason to keep the lean transport the default",
		"http2/8.1.2.6: Sends a HEADERS frame with the \"content-length\" header field which does not equal the DATA frame payload length":                      "the request has no application/grpc content-type: answered 415 at its HEADERS, before the DATA, as grpc-go does; a gRPC request whose content-length differs is reset with PROTOCOL_ERROR (TestContentLength)",
		"http2/8.1.2.6: Sends a HEADERS frame with the \"content-length\" header field which does not equal the sum of the multiple DATA frames payload length": "as above: answered 415 before the DATA; checked for gRPC requests (TestContentLength)",
		"http2/8.2: Sends a PUSH_PROMISE frame":                                                                                                                 "grpc-go's server is lenient here (the reference's server too): the reason to keep the lean transport the default",
		"skipped http2/6.5.3: Sends multiple values of SETTINGS_INITIAL_WINDOW_SIZE":                                                                            "h2spec needs an answer with a DATA body; non-gRPC requests get trailers-only answers",
		"skipped http2/6.9.1: Sends SETTINGS frame to set the initial window size to 1 and sends HEADERS frame":                                                 "h2spec needs an answer with a DATA body; flow control of gRPC answers is tested in TestLargeAnswerWaitsForFlowControl",
		"skipped http2/6.9.2: Changes SETTINGS_INITIAL_WINDOW_SIZE after sending HEADERS frame":                                                                 "h2spec needs an answer with a DATA body",
		"skipped http2/6.9.2: Sends a SETTINGS frame for window size to be negative":                                                                            "h2spec needs an answer with a DATA body",
	},
}

// h2specBinary finds h2spec: $H2SPEC, then the tools directory
// hack/install-deps.sh builds it into, then PATH.
func h2specBinary(t *testing.T) string {
	if p := os.Getenv("H2SPEC"); p != "" {
		return p
	}
	if root, err := filepath.Abs("../../.."); err == nil {
		if p := filepath.Join(root, ".tools", "bin", "h2spec"); fileExists(p) {
			return p
		}
	}
	if p, err := exec.LookPath("h2spec"); err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("h2spec is required under CI=true: hack/install-deps.sh builds it into .tools/bin")
	}
	t.Skip("h2spec not installed (hack/install-deps.sh builds it into .tools/bin)")
	return ""
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// h2specDetail is what h2spec reports of a failed case: the frames it
// expected, then the one it got (h2spec v2.2.1 writes every failure as an
// <error> element).
type h2specDetail struct {
	Text string `xml:",chardata"`
}

type junitSuites struct {
	Suites []struct {
		Name  string `xml:"name,attr"`
		Cases []struct {
			Package string        `xml:"package,attr"`
			Name    string        `xml:"classname,attr"`
			Failure *h2specDetail `xml:"failure"`
			Error   *h2specDetail `xml:"error"`
			Skipped *struct{}     `xml:"skipped"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// TestH2Spec runs the h2spec conformance suite (every case, strict ones
// included) against the gRPC port, with requests on the ShouldRateLimit
// path, on both transports.
func TestH2Spec(t *testing.T) { forEachTransportParallel(t, testH2Spec) }

func testH2Spec(t *testing.T, transport string) {
	bin := h2specBinary(t)
	r := start(t, Options{Transport: transport}, nil)
	g, _, _, _ := r.srv.Addrs()
	report := filepath.Join(t.TempDir(), "h2spec.xml")
	if d := os.Getenv("H2SPEC_REPORT_DIR"); d != "" {
		report = filepath.Join(d, transport+".xml")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	port := strconv.Itoa(tcpPort(g.String()))
	// run runs h2spec on the given sections (all when none) and returns the
	// cases passed and the ones failed or skipped, by "section: description",
	// with what h2spec expected and got for each failed one.
	details := map[string]string{}
	run := func(timeout string, sections ...string) (passed int, failed []string) {
		args := append(append([]string{}, sections...), "--strict", "-h", "127.0.0.1", "-p", port, "-P", methodShouldRateLimit, "-o", timeout, "-j", report)
		out, _ := exec.CommandContext(ctx, bin, args...).CombinedOutput() // exits 1 when a case fails; the report says which
		b, err := os.ReadFile(report)
		if err != nil {
			t.Fatalf("no h2spec report: %v\n%s", err, out)
		}
		var rep junitSuites
		if err := xml.Unmarshal(b, &rep); err != nil {
			t.Fatal(err)
		}
		for _, s := range rep.Suites {
			for _, c := range s.Cases {
				id := c.Package + ": " + c.Name
				switch {
				case c.Skipped != nil:
					failed = append(failed, "skipped "+id)
				case c.Failure != nil || c.Error != nil:
					failed = append(failed, id)
					d := c.Error
					if d == nil {
						d = c.Failure
					}
					details[id] = strings.ReplaceAll(strings.TrimSpace(d.Text), "\n", " | ")
				default:
					passed++
				}
			}
		}
		sort.Strings(failed)
		return passed, failed
	}
	passed, failed := run("3")
	allowed := h2specNotApplicable[transport]
	// expected reports whether case f's failure is one this transport is
	// known for.
	expected := func(f string) bool {
		_, ok := allowed[f]
		return ok || transport == TransportGRPCGo && grpcGoResetInsteadOfClose(details[f])
	}
	unexpected := map[string]bool{} // section -> a case there failed unexpectedly
	for _, f := range failed {
		if _, listed := allowed[f]; !listed && expected(f) {
			t.Logf("h2spec: %s: grpc-go reset the connection where it should close it (expected, then got: %s)", f, details[f])
		}
		if !expected(f) {
			unexpected[strings.TrimPrefix(strings.SplitN(f, ": ", 2)[0], "skipped ")] = true
		}
	}
	if len(unexpected) > 0 {
		// h2spec's 3 s per case can expire on a machine this busy (under
		// -race, beside another CPU-bound job): run the sections with
		// unexpected failures once more, 10 s per case; a real failure
		// repeats.
		var sections []string
		for sec := range unexpected {
			sections = append(sections, sec)
		}
		sort.Strings(sections)
		for _, f := range failed {
			if !expected(f) {
				t.Logf("h2spec: %s failed (expected, then got: %s)", f, details[f])
			}
		}
		t.Logf("h2spec: unexpected failures in %v, running those sections again", sections)
		_, again := run("10", sections...)
		for _, f := range again {
			if !expected(f) {
				t.Errorf("h2spec case fails: %s (expected, then got: %s)", f, details[f])
			}
		}
	}
	t.Logf("h2spec on %s: %d passed, %d failed (%d listed as not applicable)\n%s", transport, passed, len(failed), len(allowed), strings.Join(failed, "\n"))
	if passed < 100 {
		t.Errorf("only %d h2spec cases passed: the run did not happen", passed)
	}
}

// grpcGoResetInsteadOfClose reports whether h2spec's report of a failed
// case (what it expected, then what it got) is a connection error that
// grpc-go's server answered by closing the socket with h2spec's frames still
// unread: h2spec expected the connection to be closed (a GOAWAY, or the
// close itself) and read a reset instead. grpc-go closes on a framer error
// without a GOAWAY and without reading what is queued (HandleStreams in
// https://github.com/grpc/grpc-go/blob/v1.83.1/internal/transport/http2_server.go),
// so whether the kernel sends a FIN or a reset depends on whether the rest of
// h2spec's frames had arrived: it varies from run to run under -race. The
// lean transport reads what is queued before it closes and gets no such
// allowance.
func grpcGoResetInsteadOfClose(detail string) bool {
	return strings.Contains(detail, "Connection closed") && strings.Contains(detail, "connection reset by peer")
}

func tcpPort(addr string) int {
	i := strings.LastIndexByte(addr, ':')
	p, _ := strconv.Atoi(addr[i+1:])
	return p
}

// TestGRPCGoResetInsteadOfClose: only a reset where h2spec would have
// accepted the connection closing is grpc-go's known flip; a timeout, or a
// reset where h2spec expected an answer, is still a failure.
func TestGRPCGoResetInsteadOfClose(t *testing.T) {
	for _, tc := range []struct {
		detail string
		want   bool
	}{
		// As h2spec v2.2.1 reported case 6.2 on 2026-12-02.
		{"GOAWAY Frame (Error Code: PROTOCOL_ERROR) | Connection closed | Error: read tcp 127.0.0.1:38876->127.0.0.1:41807: read: connection reset by peer", true},
		{"GOAWAY Frame (Error Code: PROTOCOL_ERROR) | Connection closed | Timeout", false},
		{"HEADERS Frame (stream_id:1) | Error: read tcp 127.0.0.1:1->127.0.0.1:2: read: connection reset by peer", false},
		{"", false},
	} {
		if got := grpcGoResetInsteadOfClose(tc.detail); got != tc.want {
			t.Errorf("grpcGoResetInsteadOfClose(%q) = %v, want %v", tc.detail, got, tc.want)
		}
	}
}
