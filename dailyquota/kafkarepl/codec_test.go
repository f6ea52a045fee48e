package kafkarepl_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/dailyquota"
	"github.com/quotientlabs/quotient/dailyquota/kafkarepl"
	"github.com/quotientlabs/quotient/internal/kafkautil"
)

func TestCodecRoundTrip(t *testing.T) {
	c := dailyquota.Count{Key: dailyquota.Key{Subject: "k:a%20b", Policy: "day", StartMs: 1_772_323_200_000, Region: "eu-west"}, WindowMs: 86_400_000, N: 42, UpdatedMs: 1_772_323_201_234}
	v, err := kafkarepl.Encode(c)
	require.NoError(t, err)
	got, err := kafkarepl.Decode(v)
	require.NoError(t, err)
	assert.Equal(t, c, got)
	assert.Equal(t, "k:a%20b day 1772323200000 eu-west", kafkarepl.RecordKey(c.Key))
	_, err = kafkarepl.Decode([]byte{0xff, 0xff})
	assert.ErrorContains(t, err, "decode window count")
}

func TestConfigErrorsNameTheField(t *testing.T) {
	cl, err := kafkautil.New(kafkautil.DefaultConfig("127.0.0.1:9092"))
	require.NoError(t, err)
	for _, tc := range []struct {
		cfg  kafkarepl.Config
		want string
	}{
		{kafkarepl.Config{ConsumeTopics: []string{"a", "a"}}, `"a" listed twice`},
		{kafkarepl.Config{ConsumeTopics: []string{""}}, "consume topics[0]"},
		{kafkarepl.Config{Retention: -1}, "retention"},
	} {
		_, err := kafkarepl.New(cl, tc.cfg)
		assert.ErrorIs(t, err, kafkarepl.ErrConfig)
		assert.ErrorContains(t, err, tc.want)
	}
	_, err = kafkarepl.New(nil, kafkarepl.DefaultConfig())
	assert.ErrorContains(t, err, "cluster is nil")
	assert.Equal(t, []string{"quotient.daily-quota", "eu-west.quotient.daily-quota"}, kafkarepl.MirroredTopics(kafkarepl.DefaultTopic, "eu-west"))
}
