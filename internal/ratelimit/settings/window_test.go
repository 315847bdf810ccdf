package settings

import (
	"io"
	"strings"
	"testing"

	"github.com/budgetgen/budgetgen/internal/ratelimit/window"
)

func TestWindowSettings(t *testing.T) {
	for _, c := range []struct {
		name    string
		env     map[string]string
		args    []string
		mode    window.Mode
		zone    string
		wantErr string
	}{
		{name: "default is calendar UTC", mode: window.Calendar, zone: "UTC"},
		{name: "epoch", env: map[string]string{"WINDOW_MODE": "epoch"}, mode: window.Epoch, zone: "UTC"},
		{name: "zone", env: map[string]string{"RESET_TIME_ZONE": "Europe/Paris"}, mode: window.Calendar, zone: "Europe/Paris"},
		{name: "flag wins", env: map[string]string{"WINDOW_MODE": "epoch"}, args: []string{"-window-mode", "calendar"}, mode: window.Calendar, zone: "UTC"},
		{name: "reference alias true", env: map[string]string{"USE_CALENDAR_MONTH_RATE_LIMIT": "true"}, mode: window.Calendar, zone: "UTC"},
		{name: "reference alias false is the reference's epoch month", env: map[string]string{"USE_CALENDAR_MONTH_RATE_LIMIT": "false"}, mode: window.Epoch, zone: "UTC"},
		{name: "alias agreeing with WINDOW_MODE", env: map[string]string{"USE_CALENDAR_MONTH_RATE_LIMIT": "1", "WINDOW_MODE": "calendar"}, mode: window.Calendar, zone: "UTC"},
		{name: "alias conflicting", env: map[string]string{"USE_CALENDAR_MONTH_RATE_LIMIT": "true", "WINDOW_MODE": "epoch"}, wantErr: "conflicts with WINDOW_MODE=epoch"},
		{name: "alias not boolean", env: map[string]string{"USE_CALENDAR_MONTH_RATE_LIMIT": "yes please"}, wantErr: "USE_CALENDAR_MONTH_RATE_LIMIT: not a boolean"},
		{name: "unknown mode", env: map[string]string{"WINDOW_MODE": "sliding"}, wantErr: "WINDOW_MODE: unknown window mode"},
		{name: "unknown zone", env: map[string]string{"RESET_TIME_ZONE": "Mars/Olympus"}, wantErr: "RESET_TIME_ZONE: \"Mars/Olympus\" is not an IANA time zone"},
		{name: "Local is not a zone name", env: map[string]string{"RESET_TIME_ZONE": "Local"}, wantErr: "is not an IANA time zone"},
		{name: "zone with epoch", env: map[string]string{"RESET_TIME_ZONE": "Europe/Paris", "WINDOW_MODE": "epoch"}, wantErr: "needs calendar windows"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := Load(c.args, envOf(c.env), io.Discard)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			w, err := s.Windows()
			if err != nil {
				t.Fatal(err)
			}
			if w.Mode() != c.mode || w.Location().String() != c.zone {
				t.Fatalf("windows %v in %v, want %v in %v", w.Mode(), w.Location(), c.mode, c.zone)
			}
		})
	}
}
