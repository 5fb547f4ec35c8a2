package ingest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
)

// ListenSyslog binds a UDP socket for syslog datagrams (HAProxy's `log`
// directive, nginx's `access_log syslog:server=`).
func ListenSyslog(addr string) (*net.UDPConn, error) {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("ingest: syslog listen %s: %w", addr, err)
	}
	conn, err := net.ListenUDP("udp", ua)
	if err != nil {
		return nil, fmt.Errorf("ingest: syslog listen %s: %w", addr, err)
	}
	conn.SetReadBuffer(4 << 20)
	return conn, nil
}

// ServeSyslog reads datagrams from conn until ctx ends (it then closes
// conn) and calls handle with the message of each, its syslog header
// removed (SyslogMessage).
func ServeSyslog(ctx context.Context, conn *net.UDPConn, handle func(msg []byte)) error {
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	buf := make([]byte, 64<<10)
	for {
		n, _, err := conn.ReadFromUDP(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("ingest: syslog: %w", err)
		}
		handle(SyslogMessage(buf[:n]))
	}
}

// SyslogMessage returns the MSG part of a syslog line: after "<PRI>", an
// RFC 5424 header (VERSION TIMESTAMP HOSTNAME APP-NAME PROCID MSGID
// STRUCTURED-DATA) or an RFC 3164 one ("Mmm dd hh:mm:ss [host] tag[pid]: ").
// A line without a header (a raw log line) is returned trimmed.
func SyslogMessage(line []byte) []byte {
	line = bytes.TrimRight(line, "\r\n\x00")
	rest := line
	if len(rest) > 2 && rest[0] == '<' {
		if i := bytes.IndexByte(rest[:min(len(rest), 6)], '>'); i > 1 {
			rest = rest[i+1:]
		}
	}
	if len(rest) > 2 && rest[0] >= '1' && rest[0] <= '9' && rest[1] == ' ' {
		// RFC 5424: skip six fields, then the structured data.
		fields := rest
		for range 6 {
			i := bytes.IndexByte(fields, ' ')
			if i < 0 {
				return bytes.TrimSpace(rest)
			}
			fields = fields[i+1:]
		}
		if len(fields) > 0 && fields[0] == '[' {
			depth := 0
			for i := 0; i < len(fields); i++ {
				switch fields[i] {
				case '\\':
					i++
				case '[':
					depth++
				case ']':
					depth--
					if depth == 0 && (i+1 == len(fields) || fields[i+1] == ' ') {
						fields = fields[i+1:]
						i = len(fields) // done
					}
				}
			}
		} else if len(fields) > 0 && fields[0] == '-' {
			fields = fields[1:]
		}
		return bytes.TrimPrefix(bytes.TrimSpace(fields), []byte("\xef\xbb\xbf"))
	}
	// RFC 3164: "Mmm dd hh:mm:ss " then the tag up to the first ": ".
	if len(rest) > 16 && isMonth(rest[:3]) && rest[3] == ' ' && rest[15] == ' ' {
		if i := bytes.Index(rest[16:], []byte(": ")); i >= 0 {
			return bytes.TrimSpace(rest[16+i+2:])
		}
	}
	return bytes.TrimSpace(rest)
}

func isMonth(b []byte) bool {
	switch string(b) {
	case "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec":
		return true
	}
	return false
}
