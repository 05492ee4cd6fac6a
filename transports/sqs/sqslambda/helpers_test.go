package sqslambda_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/plugbus/plugbus/internal/sqstest"
	"github.com/plugbus/plugbus/transports/sqs"
)

// httpTransport is shared by the tests' AWS clients, so that TestMain can
// close its idle connections before looking for leaked goroutines.
var httpTransport = &http.Transport{MaxIdleConns: 64, MaxIdleConnsPerHost: 32, IdleConnTimeout: 30 * time.Second}

func TestMain(m *testing.M) { sqstest.Main(m, httpTransport) }

// awsConfig points the SDK at the local emulator with static credentials.
func awsConfig(t testing.TB) aws.Config {
	t.Helper()
	return sqstest.Config(t, &http.Client{Transport: httpTransport})
}

// openTransport returns a transport with sqstest.FastOptions on a fresh prefix,
// closed at the end of the test (before its queues are deleted).
func openTransport(t testing.TB) *sqs.Transport {
	t.Helper()
	cfg := awsConfig(t)
	tr := sqstest.New(t, cfg, sqstest.FastOptions(sqstest.UniquePrefix(t, cfg))...)
	t.Cleanup(func() { _ = tr.Close(context.Background()) })
	return tr
}
