package natsrv

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestStart(t *testing.T) {
	tests := []struct {
		name          string
		settings      Settings
		wantJetStream bool
	}{
		{"jetstream temp store", Settings{}, true},
		{"jetstream given store", Settings{Listen: "127.0.0.1:-1", StoreDir: t.TempDir()}, true},
		{"core only", Settings{Listen: "127.0.0.1:0", NoJetStream: true}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, err := Start(tt.settings)
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Shutdown()
			if got := srv.JetStream(); got != tt.wantJetStream {
				t.Errorf("JetStream() = %v, want %v", got, tt.wantJetStream)
			}
			nc, err := nats.Connect(srv.ClientURL())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			_, err = js.AccountInfo(t.Context())
			if tt.wantJetStream && err != nil {
				t.Errorf("AccountInfo: %v", err)
			}
			if !tt.wantJetStream && !errors.Is(err, jetstream.ErrJetStreamNotEnabled) {
				t.Errorf("AccountInfo error = %v, want ErrJetStreamNotEnabled", err)
			}
		})
	}
}

func TestShutdownIdempotentAndRemovesTempStore(t *testing.T) {
	srv, err := Start(Settings{})
	if err != nil {
		t.Fatal(err)
	}
	dir := srv.tempDir
	if dir == "" {
		t.Fatal("no temporary store directory")
	}
	srv.Shutdown()
	srv.Shutdown()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("temporary store %s still exists (stat error %v)", dir, err)
	}
	if _, err := nats.Connect(srv.ClientURL(), nats.Timeout(time.Second)); err == nil {
		t.Error("connect after Shutdown succeeded")
	}
}

func TestStartRejectsBadListen(t *testing.T) {
	for _, listen := range []string{"nonsense", "127.0.0.1:x", "127.0.0.1:70000"} {
		if srv, err := Start(Settings{Listen: listen}); err == nil {
			srv.Shutdown()
			t.Errorf("Start(Listen: %q) succeeded", listen)
		}
	}
}

func TestLogf(t *testing.T) {
	lines := make(chan string, 100)
	srv, err := Start(Settings{NoJetStream: true, Logf: func(format string, args ...any) {
		select {
		case lines <- format:
		default:
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	srv.Shutdown()
	if len(lines) == 0 {
		t.Error("Logf received nothing from a starting server")
	}
}
