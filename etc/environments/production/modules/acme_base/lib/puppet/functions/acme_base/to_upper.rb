# Upper-cases a string; a tiny example of a modern Puppet function.
Puppet::Functions.create_function(:'acme_base::to_upper') do
  dispatch :to_upper do
    param 'String', :value
    return_type 'String'
  end

  def to_upper(value)
    value.upcase
  end
end
